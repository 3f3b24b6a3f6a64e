"""Sandbox calls are keyed like effects, on (run, scope, name): a fan-out branch's calls
("7/b3") no longer collide with its siblings' ("7/b1") at the same visit."""

from django.db import migrations, models
from django.db.models.functions import Cast


def scope_from_visit(apps, schema_editor):
    execution = apps.get_model("sandboxes", "SandboxExecution")
    execution.objects.update(scope=Cast("visit", models.CharField()))


class Migration(migrations.Migration):
    dependencies = [("sandboxes", "0002_egress_rule")]

    operations = [
        migrations.AddField(
            model_name="sandboxexecution", name="scope",
            field=models.CharField(default="", max_length=40), preserve_default=False,
        ),
        migrations.RunPython(scope_from_visit, migrations.RunPython.noop),
        migrations.RemoveConstraint(
            model_name="sandboxexecution", name="sandbox_execution_run_visit_name_unique",
        ),
        migrations.AddConstraint(
            model_name="sandboxexecution",
            constraint=models.UniqueConstraint(fields=("run", "scope", "name"),
                                               name="sandbox_execution_run_scope_name_unique"),
        ),
    ]
