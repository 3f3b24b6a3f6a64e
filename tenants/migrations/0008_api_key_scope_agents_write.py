import django.contrib.postgres.fields
from django.db import migrations, models

OLD_SCOPES = ["runs:read", "runs:write", "approvals:decide", "events:write", "admin"]
ALL_SCOPES = ["runs:read", "runs:write", "approvals:decide", "events:write", "agents:write", "admin"]


def grant_to_keys_holding_every_scope(apps, schema_editor):
    """A key that could do everything before agents:write existed still can."""
    ApiKey = apps.get_model("tenants", "ApiKey")
    ApiKey.objects.filter(scopes__contains=OLD_SCOPES).exclude(scopes__contains=["agents:write"]) \
        .update(scopes=ALL_SCOPES)


def revoke(apps, schema_editor):
    ApiKey = apps.get_model("tenants", "ApiKey")
    for key in ApiKey.objects.filter(scopes__contains=["agents:write"]):
        key.scopes = [scope for scope in key.scopes if scope != "agents:write"]
        key.save(update_fields=["scopes"])


class Migration(migrations.Migration):
    """The agents:write scope (tenant-defined agents); keys that held every scope get it too."""

    dependencies = [
        ('tenants', '0007_people'),
    ]

    operations = [
        migrations.RemoveConstraint(model_name='apikey', name='api_key_scopes_known'),
        migrations.AlterField(
            model_name='apikey',
            name='scopes',
            field=django.contrib.postgres.fields.ArrayField(
                base_field=models.CharField(choices=[('runs:read', 'Runs Read'), ('runs:write', 'Runs Write'), ('approvals:decide', 'Approvals Decide'), ('events:write', 'Events Write'), ('agents:write', 'Agents Write'), ('admin', 'Admin')], max_length=32),
                size=None),
        ),
        migrations.AddConstraint(
            model_name='apikey',
            constraint=models.CheckConstraint(condition=models.Q(('scopes__contained_by', ALL_SCOPES)), name='api_key_scopes_known'),
        ),
        migrations.RunPython(grant_to_keys_holding_every_scope, revoke),
    ]
