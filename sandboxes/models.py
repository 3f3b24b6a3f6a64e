"""Sandbox records (tenant schema): each sandboxed command a step ran, and workspace snapshots."""

from django.db import models


class SandboxExecution(models.Model):
    """One `ctx.sandbox.run()`, keyed like effects: (run, scope, name), the scope being the step
    visit ("7") or a fan-out branch of it ("7/b3"), so parallel branches keep their own calls.

    `durable` becomes true once the workspace it left is in a snapshot (or it changed nothing
    since the last one); only then may a re-run step on another worker replay it.
    """

    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="sandbox_executions")
    visit = models.PositiveIntegerField()
    scope = models.CharField(max_length=40)
    name = models.CharField(max_length=200)
    command = models.JSONField()
    exit_code = models.IntegerField()
    limit = models.CharField(max_length=16, blank=True, default="")
    stdout = models.TextField(blank=True, default="")
    stderr = models.TextField(blank=True, default="")
    stdout_truncated = models.BooleanField(default=False)
    stderr_truncated = models.BooleanField(default=False)
    changed_files = models.JSONField(default=list)
    deleted_files = models.JSONField(default=list)
    duration_ms = models.FloatField(default=0.0)
    cpu_ms = models.FloatField(null=True, blank=True)  # the jail's cgroup CPU time, if accounted
    durable = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "scope", "name"],
                                    name="sandbox_execution_run_scope_name_unique")
        ]


class WorkspaceSnapshot(models.Model):
    """The run's workspace as the step at `visit` left it: tar.gz, AES-256-GCM, in S3. A fan-out
    branch's own workspace is snapshotted under its `scope` ("7/b3"); the run's has scope ""."""

    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="workspace_snapshots")
    visit = models.PositiveIntegerField()
    scope = models.CharField(max_length=40, blank=True, default="")
    object_key = models.CharField(max_length=400)
    key_version = models.PositiveIntegerField()
    size_bytes = models.BigIntegerField()
    file_count = models.PositiveIntegerField()
    sha256 = models.CharField(max_length=64)  # of the stored (encrypted) object
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "visit", "scope"],
                                    name="workspace_snapshot_run_visit_scope_unique")
        ]


class SandboxEgressRule(models.Model):
    """One entry of the tenant's egress allow-list (`host`, `*.domain` or an IP, optional
    `:port`; see sandboxes/egress.py). No rows: the tenant's jails have no network at all."""

    rule = models.CharField(max_length=300, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
