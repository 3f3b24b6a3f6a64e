from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("usage", "0001_initial"),
    ]

    operations = [
        migrations.AddField(
            model_name="usageday",
            name="api_requests_life",
            field=models.CharField(blank=True, default="", max_length=32),
        ),
        migrations.AddField(
            model_name="usageday",
            name="api_requests_seen",
            field=models.PositiveBigIntegerField(default=0),
        ),
    ]
