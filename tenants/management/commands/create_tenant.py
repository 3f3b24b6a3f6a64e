from django.core.management.base import BaseCommand, CommandError

from tenants.services import TenantError, tenant_create


class Command(BaseCommand):
    help = "Provision a tenant: schema, migrations, data key and a first API key (shown once)."

    def add_arguments(self, parser):
        parser.add_argument("schema_name")
        parser.add_argument("--name", default="")

    def handle(self, schema_name, name, **options):
        try:
            provisioned = tenant_create(schema_name=schema_name, name=name)
        except TenantError as exc:
            raise CommandError(str(exc)) from None
        if not provisioned.created:
            self.stdout.write(f"tenant {schema_name} already exists; nothing changed")
            return
        self.stdout.write(self.style.SUCCESS(f"created tenant {schema_name}"))
        self.stdout.write(f"API key (shown once, store it now): {provisioned.api_key}")
