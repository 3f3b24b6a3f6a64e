import django.contrib.postgres.fields
from django.db import migrations, models

ALL_SCOPES = ["runs:read", "runs:write", "approvals:decide", "events:write", "admin"]


class Migration(migrations.Migration):
    """Keys made before scopes existed could do everything: they keep every scope."""

    dependencies = [
        ('tenants', '0004_data_keys_bound_to_tenant'),
    ]

    operations = [
        migrations.AddField(
            model_name='apikey',
            name='scopes',
            field=django.contrib.postgres.fields.ArrayField(
                base_field=models.CharField(choices=[('runs:read', 'Runs Read'), ('runs:write', 'Runs Write'), ('approvals:decide', 'Approvals Decide'), ('events:write', 'Events Write'), ('admin', 'Admin')], max_length=32),
                default=ALL_SCOPES, size=None),
            preserve_default=False,
        ),
        migrations.AddConstraint(
            model_name='apikey',
            constraint=models.CheckConstraint(condition=models.Q(('scopes__contained_by', ALL_SCOPES)), name='api_key_scopes_known'),
        ),
    ]
