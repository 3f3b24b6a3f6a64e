from django.core.management.base import BaseCommand, CommandError

from tenants.models import ApiKey, Scope, Tenant
from tenants.services import TenantError, api_key_create, api_key_revoke


class Command(BaseCommand):
    help = "Create (shown once), list or revoke a tenant's API keys."

    def add_arguments(self, parser):
        parser.add_argument("action", choices=["create", "list", "revoke"])
        parser.add_argument("schema_name")
        parser.add_argument("--name", default="default")
        parser.add_argument("--prefix", help="the key to revoke (the part after 'ap_')")
        parser.add_argument("--scopes", help="comma-separated scopes of a new key (default: all "
                                             f"of {','.join(Scope.values)})")

    def handle(self, action, schema_name, name, prefix, scopes, **options):
        tenant = Tenant.objects.filter(schema_name=schema_name).first()
        if tenant is None:
            raise CommandError(f"no tenant {schema_name}")
        if action == "create":
            try:
                key, plaintext = api_key_create(
                    tenant=tenant, name=name,
                    scopes=scopes.split(",") if scopes is not None else None)
            except TenantError as exc:
                raise CommandError(str(exc)) from None
            self.stdout.write(f"API key with scopes {','.join(key.scopes)} "
                              f"(shown once, store it now): {plaintext}")
        elif action == "list":
            for key in tenant.api_keys.order_by("created_at"):
                state = f"revoked {key.revoked_at:%Y-%m-%d}" if key.revoked_at else "active"
                self.stdout.write(f"ap_{key.prefix}_…  {key.name}  {','.join(key.scopes)}  {state}  "
                                  f"last used {key.last_used_at}")
        else:
            key = ApiKey.objects.filter(tenant=tenant, prefix=prefix).first()
            if key is None:
                raise CommandError(f"tenant {schema_name} has no key with prefix {prefix!r}")
            api_key_revoke(key=key)
            self.stdout.write(f"revoked ap_{prefix}_…")
