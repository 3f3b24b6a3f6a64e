"""A fan-out branch's workspace is snapshotted under its own scope ("7/b3"), beside the run's
(scope ""), so parallel branches never overwrite the run's snapshot of the same visit."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("sandboxes", "0003_sandbox_execution_scope")]

    operations = [
        migrations.AddField(
            model_name="workspacesnapshot", name="scope",
            field=models.CharField(blank=True, default="", max_length=40),
        ),
        migrations.RemoveConstraint(
            model_name="workspacesnapshot", name="workspace_snapshot_run_visit_unique",
        ),
        migrations.AddConstraint(
            model_name="workspacesnapshot",
            constraint=models.UniqueConstraint(fields=("run", "visit", "scope"),
                                               name="workspace_snapshot_run_visit_scope_unique"),
        ),
    ]
