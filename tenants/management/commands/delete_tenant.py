from django.core.management.base import BaseCommand, CommandError

from tenants.models import Tenant
from tenants.services import TenantError, tenant_delete


class Command(BaseCommand):
    help = ("Delete a tenant: its S3 objects, this host's workspace copies, its schema and its "
            "rows. Irreversible; needs --yes.")

    def add_arguments(self, parser):
        parser.add_argument("schema_name")
        parser.add_argument("--yes", action="store_true", help="confirm the deletion")

    def handle(self, schema_name, yes, **options):
        tenant = Tenant.objects.filter(schema_name=schema_name).first()
        if tenant is None:
            raise CommandError(f"no tenant {schema_name}")
        if not yes:
            raise CommandError(f"this deletes tenant {schema_name}, its schema, archives and "
                               "workspaces; add --yes")
        try:
            tenant_delete(tenant=tenant)
        except TenantError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(self.style.SUCCESS(f"deleted tenant {schema_name}"))
