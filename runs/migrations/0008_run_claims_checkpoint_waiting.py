from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0007_alter_run_cost_usd_alter_run_tokens_used'),
    ]

    operations = [
        migrations.AddField(
            model_name='run',
            name='claims_without_checkpoint',
            field=models.PositiveIntegerField(db_default=0, default=0),
        ),
        migrations.AddField(
            model_name='checkpoint',
            name='waiting',
            field=models.JSONField(blank=True, null=True),
        ),
    ]
