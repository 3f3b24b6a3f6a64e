from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("dispatch", "0002_wakeup")]

    operations = [
        migrations.AddField(
            model_name="readyrun",
            name="deferred_since",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
