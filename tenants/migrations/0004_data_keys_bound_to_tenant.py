"""Re-wrap every data key of the first wrap format (AES key wrap, bound to nothing) in the
tenant-bound format (AES-GCM, tenant id, schema and version as associated data). Needs the
master key the keys were wrapped with (AGENTPLATFORM_MASTER_KEY); refuses loudly without it.
The data keys themselves do not change, so nothing sealed under them needs re-sealing."""

import hmac

from django.db import migrations

from tenants import keys


def rewrap(apps, schema_editor):
    TenantKey = apps.get_model("tenants", "TenantKey")
    legacy = [row for row in TenantKey.objects.select_related("tenant").order_by("pk")
              if keys.is_legacy_wrap(row.wrapped_key)]
    if not legacy:
        return
    master = keys.master_key()
    for row in legacy:
        if not hmac.compare_digest(row.master_key_id, keys.master_key_id(master)):
            raise keys.KeyUnwrapError(
                f"data key v{row.version} of {row.tenant.schema_name} was wrapped by master key "
                f"{row.master_key_id}, not by the configured one")
        data_key = keys.legacy_data_key_unwrap(row.wrapped_key, wrapping_key=master)
        row.wrapped_key = keys.data_key_wrap(data_key, tenant_id=row.tenant_id,
                                             schema=row.tenant.schema_name, version=row.version,
                                             wrapping_key=master)
        row.save(update_fields=["wrapped_key"])


class Migration(migrations.Migration):

    dependencies = [
        ("tenants", "0003_tenant_superusers_only_console_access"),
    ]

    operations = [
        migrations.RunPython(rewrap, migrations.RunPython.noop),
    ]
