"""Rotate a tenant's data key: new version; archive keys re-wrapped, credentials, Slack secrets and
workspace snapshots re-sealed; older versions optionally retired (they open nothing after)."""

from django.core.management.base import BaseCommand, CommandError
from django_tenants.utils import tenant_context

from runs.retention import services
from tenants.models import Tenant


class Command(BaseCommand):
    help = ("rotate_data_key <schema> [--retire-old]: new data key version; re-seal everything "
            "sealed under older ones")

    def add_arguments(self, parser):
        parser.add_argument("schema")
        parser.add_argument("--retire-old", action="store_true",
                            help="retire the older versions once nothing is sealed under them")

    def handle(self, *args, schema, retire_old=False, **options):
        tenant = Tenant.objects.filter(schema_name=schema).first()
        if tenant is None:
            raise CommandError(f"no tenant {schema!r}")
        with tenant_context(tenant):
            try:
                key = services.data_key_rotate(tenant=tenant, retire_old=retire_old)
            except services.RetentionError as exc:
                raise CommandError(str(exc)) from None
        self.stdout.write(f"{schema}: data key v{key.version} active"
                          + ("; older versions retired" if retire_old else ""))
