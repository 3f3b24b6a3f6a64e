from django.core.management.base import BaseCommand, CommandError

from tenants.models import ApiKey, Tenant
from tenants.services import api_key_create, api_key_revoke


class Command(BaseCommand):
    help = "Create (shown once), list or revoke a tenant's API keys."

    def add_arguments(self, parser):
        parser.add_argument("action", choices=["create", "list", "revoke"])
        parser.add_argument("schema_name")
        parser.add_argument("--name", default="default")
        parser.add_argument("--prefix", help="the key to revoke (the part after 'ap_')")

    def handle(self, action, schema_name, name, prefix, **options):
        tenant = Tenant.objects.filter(schema_name=schema_name).first()
        if tenant is None:
            raise CommandError(f"no tenant {schema_name}")
        if action == "create":
            _, plaintext = api_key_create(tenant=tenant, name=name)
            self.stdout.write(f"API key (shown once, store it now): {plaintext}")
        elif action == "list":
            for key in tenant.api_keys.order_by("created_at"):
                state = f"revoked {key.revoked_at:%Y-%m-%d}" if key.revoked_at else "active"
                self.stdout.write(f"ap_{key.prefix}_…  {key.name}  {state}  last used {key.last_used_at}")
        else:
            key = ApiKey.objects.filter(tenant=tenant, prefix=prefix).first()
            if key is None:
                raise CommandError(f"tenant {schema_name} has no key with prefix {prefix!r}")
            api_key_revoke(key=key)
            self.stdout.write(f"revoked ap_{prefix}_…")
