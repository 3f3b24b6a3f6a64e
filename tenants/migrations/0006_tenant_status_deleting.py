from django.db import migrations, models


class Migration(migrations.Migration):
    """A tenant whose deletion has begun is `deleting`: it can never be reactivated."""

    dependencies = [
        ("tenants", "0005_api_key_scopes"),
    ]

    operations = [
        migrations.AlterField(
            model_name="tenant",
            name="status",
            field=models.CharField(choices=[("active", "Active"), ("suspended", "Suspended"),
                                            ("deleting", "Deleting")],
                                   default="active", max_length=16),
        ),
        migrations.AddConstraint(
            model_name="tenant",
            constraint=models.CheckConstraint(
                condition=models.Q(status__in=["active", "suspended", "deleting"]),
                name="tenant_status_known"),
        ),
    ]
