"""Retention records (tenant schema): one Archive row per run that left the hot store, the
tenant's own retention policy, and per-run overrides of the agent's retention policy.

`TenantArchives` is a proxy of the public Tenant model for the operators' console.
"""

from datetime import timedelta

from django.db import models

from runs.models import Run
from tenants.models import Tenant


class Archive(models.Model):
    """A run's history sealed into one S3 object, or the reason it is not there yet.

    ARCHIVED is written in the same transaction that prunes the run's hot rows, and only after
    the store confirmed the upload's sha256 (or the object was read back and matched); so a run
    is either hot or verifiably archived. FAILED keeps the last error while the hot rows stay.
    """

    class Status(models.TextChoices):
        ARCHIVED = "archived"
        FAILED = "failed"  # the hot rows are untouched; the next pass tries again
        DISCARDED = "discarded"  # pruned without an archive (policy archive_required=False)

    run_id = models.UUIDField(unique=True)  # no ForeignKey: the run row is gone once archived
    agent = models.CharField(max_length=100, blank=True, default="")
    status = models.CharField(max_length=16, choices=Status.choices)
    object_key = models.CharField(max_length=300, blank=True, default="")
    sha256 = models.CharField(max_length=64, blank=True, default="")
    size = models.BigIntegerField(default=0)
    sealed_key_version = models.PositiveIntegerField(null=True)  # bound into the object's header
    key_version = models.PositiveIntegerField(null=True)  # the tenant key wrapping `wrapped_key`
    wrapped_key = models.BinaryField(null=True)  # the object's own key, AES-GCM-wrapped
    counts = models.JSONField(default=dict)  # rows per table
    run_finished_at = models.DateTimeField(null=True)
    archived_at = models.DateTimeField(null=True)
    attempts = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True, default="")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        indexes = [models.Index(fields=["status", "key_version"])]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(status__in=["archived", "failed", "discarded"]),
                name="archive_status_valid"),
        ]

    def __str__(self) -> str:
        return f"archive of run {self.run_id} ({self.status})"


class RunRetention(models.Model):
    """A run's own retention policy; a null field falls back to the agent's (or the default)."""

    run = models.OneToOneField(Run, on_delete=models.CASCADE, primary_key=True,
                               related_name="retention_override")
    history = models.CharField(max_length=8, null=True, blank=True,
                               choices=[("full", "full"), ("shallow", "shallow")])
    ttl = models.DurationField(null=True, blank=True)
    archive_required = models.BooleanField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=models.Q(history__in=["full", "shallow"])
                                   | models.Q(history=None), name="run_retention_history_valid"),
        ]


class TenantRetention(models.Model):
    """The tenant's own policy (one row at most, set by its owners): for the runs of agents that
    declare no RetentionPolicy, in place of the platform's RETENTION_HISTORY and
    RETENTION_TTL_DAYS. Whether runs are archived before pruning stays the platform's."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    history = models.CharField(max_length=8, choices=[("full", "full"), ("shallow", "shallow")])
    ttl = models.DurationField()
    updated_at = models.DateTimeField(auto_now=True)
    updated_by = models.CharField(max_length=260)  # "user:<email>"

    class Meta:
        constraints = [
            models.CheckConstraint(condition=models.Q(id=1), name="tenant_retention_one_row"),
            models.CheckConstraint(condition=models.Q(history__in=["full", "shallow"]),
                                   name="tenant_retention_history_valid"),
            models.CheckConstraint(condition=models.Q(ttl__gt=timedelta(0)),
                                   name="tenant_retention_ttl_positive"),
        ]

    def __str__(self) -> str:
        return f"tenant retention: {self.history}, {self.ttl}"


class TenantArchives(Tenant):
    class Meta:
        proxy = True
        verbose_name = "tenant archives"
        verbose_name_plural = "tenant archives"


