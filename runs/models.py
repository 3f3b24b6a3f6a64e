"""Runs and their records (tenant schema): the run, its session log, checkpoints, log entries.

RunEvent and LogEntry are append-only: a trigger refuses UPDATE and DELETE unless the
transaction set `agentplatform.allow_prune = 'on'` (only the retention job does).

HISTORY_HELD_BY_RUN: checkpoints and log entries, a step's rows, have no foreign key to their
run in the database; its check cost every step ~8% of its time (docs/decisions/0027). Their
run is held instead by whoever writes them, in the same transaction: `run_start` inserts it in
the same statement, the checkpoint statement locks it FOR SHARE (its fence), a wake-up locks it
FOR UPDATE, a fork creates it; and the archive pass locks the runs it prunes FOR UPDATE before
it reads their rows. So no such row outlives its run, or is written for a run that is gone.
"""

import uuid

from django.db import models


class Run(models.Model):
    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        WAITING = "waiting"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        CANCELLED = "cancelled"

    class Durability(models.TextChoices):
        SYNC = "sync"
        ASYNC = "async"
        EXIT = "exit"

    FINISHED = (Status.SUCCEEDED, Status.FAILED, Status.CANCELLED)

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    agent = models.CharField(max_length=100)
    agent_version = models.PositiveIntegerField()
    topology_hash = models.CharField(max_length=64)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    durability = models.CharField(max_length=8, choices=Durability.choices, default=Durability.SYNC)
    idempotency_key = models.CharField(max_length=255, null=True, blank=True, unique=True)
    input = models.JSONField(default=dict)
    result = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    waiting_reason = models.TextField(blank=True, default="")

    max_steps = models.PositiveIntegerField(default=1000)
    max_wall_seconds = models.FloatField(default=3600.0)
    max_tokens = models.PositiveBigIntegerField(null=True, blank=True)  # model-call budgets
    max_cost_usd = models.DecimalField(max_digits=12, decimal_places=6, null=True, blank=True)
    tokens_used = models.PositiveBigIntegerField(default=0, db_default=0)
    cost_usd = models.DecimalField(max_digits=12, decimal_places=6, default=0, db_default=0)
    steps_taken = models.PositiveIntegerField(default=0)
    active_seconds = models.FloatField(default=0.0)
    cancel_requested = models.BooleanField(default=False)
    # Claims since the last checkpoint: a step that kills its worker every time is a poison
    # step; after RUN_MAX_CLAIMS_WITHOUT_CHECKPOINT the run is parked for a person.
    claims_without_checkpoint = models.PositiveIntegerField(default=0, db_default=0)

    lease_owner = models.CharField(max_length=200, blank=True, default="")
    lease_epoch = models.BigIntegerField(default=0)
    lease_expires_at = models.DateTimeField(null=True, blank=True)

    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL,
                               related_name="children")  # a child run reports to its parent
    forked_from = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL,
                                    related_name="forks")
    forked_from_visit = models.PositiveIntegerField(null=True, blank=True)

    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["status", "created_at"]),
            models.Index(fields=["agent", "created_at"]),
            # retention's pick of the runs due, oldest first (migration 0012 builds it concurrently)
            models.Index(fields=["finished_at", "id"], name="runs_run_finished_idx",
                         condition=models.Q(finished_at__isnull=False)),
        ]
        # The hot path writes raw SQL, which `choices` never see: the database holds the rules
        # (docs/decisions/0009-state-rules.md).
        constraints = [
            models.CheckConstraint(condition=models.Q(status__in=[
                "queued", "running", "waiting", "succeeded", "failed", "cancelled"]),
                name="run_status_valid"),
            models.CheckConstraint(condition=models.Q(durability__in=["sync", "async", "exit"]),
                                   name="run_durability_valid"),
            models.CheckConstraint(condition=models.Q(lease_owner="", lease_expires_at=None) | (
                ~models.Q(lease_owner="") & models.Q(lease_expires_at__isnull=False)),
                name="run_lease_owner_iff_expiry"),
            models.CheckConstraint(condition=models.Q(
                status__in=["succeeded", "failed", "cancelled"], finished_at__isnull=False) | (
                ~models.Q(status__in=["succeeded", "failed", "cancelled"])
                & models.Q(finished_at=None)),
                name="run_finished_iff_finished_at"),
        ]

    def __str__(self) -> str:
        return f"{self.agent} v{self.agent_version} {self.id}"

    @property
    def is_finished(self) -> bool:
        return self.status in self.FINISHED


class RunEvent(models.Model):
    """The session log: what happened, one row per event, never updated."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="events")
    kind = models.CharField(max_length=40)
    visit = models.PositiveIntegerField(null=True)
    data = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["run", "id"])]


class AppendOnly(models.Model):
    """A row of a run's history, keyed on its natural key: written once, never updated."""

    class Meta:
        abstract = True

    def save(self, *args, **kwargs):
        """Always an INSERT: with its whole key set, a composite key's `save()` would try an
        UPDATE first, which the append-only trigger refuses (or, while pruning, lets pass as
        a no-op that inserts nothing)."""
        kwargs.setdefault("force_insert", True)
        super().save(*args, **kwargs)


class Checkpoint(AppendOnly):
    """Where a run is after `visit` completed steps: next step, small state, log offsets.

    Keyed on (run, visit), its natural key: a step's insert maintains one index, not two
    (docs/benchmarks.md, 2026-12-06). The table still has the `id` column earlier releases
    keyed it on, drawn by its default and never named here, until a later release drops it
    (migration 0010)."""

    pk = models.CompositePrimaryKey("run_id", "visit")
    # db_index=False: the primary key's index already serves lookups by run. No foreign key in
    # the database (HISTORY_HELD_BY_RUN): every writer holds the run's row.
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="checkpoints",
                            db_index=False, db_constraint=False)
    visit = models.PositiveIntegerField()
    step = models.CharField(max_length=100, null=True)  # next step to run; null when ended
    state = models.JSONField(default=dict)
    log_offsets = models.JSONField(default=dict)
    agent_version = models.PositiveIntegerField()
    topology_hash = models.CharField(max_length=64)
    # What the run waits on at this checkpoint, if it parked here: {"kind": "approval" |
    # "event" | "timer" | "child_run" | "fan_out", ...the wait's arguments}. A fork re-opens it.
    waiting = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)


class LogEntry(AppendOnly):
    """One entry of a run's append-only log, stored once; checkpoints hold only offsets. Keyed
    on (run, log, index), like a checkpoint on its natural key."""

    pk = models.CompositePrimaryKey("run_id", "log", "index")
    # the primary key's index serves it; no foreign key in the database (HISTORY_HELD_BY_RUN)
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="log_entries",
                            db_index=False, db_constraint=False)
    log = models.CharField(max_length=64)
    index = models.PositiveIntegerField()
    visit = models.PositiveIntegerField()
    value = models.JSONField()


class Branch(models.Model):
    """One branch of a fan-out: runs the fan-out step for one item on any worker; its result is
    a pending write that the join step reads once every branch has one."""

    class Status(models.TextChoices):
        PENDING = "pending"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="branches")
    visit = models.PositiveIntegerField()  # the checkpoint the run parked at
    index = models.PositiveIntegerField()
    step = models.CharField(max_length=100)
    item = models.JSONField(null=True)
    status = models.CharField(max_length=8, choices=Status.choices, default=Status.PENDING)
    result = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    attempts = models.PositiveIntegerField(default=0)
    lease_owner = models.CharField(max_length=200, blank=True, default="")
    lease_epoch = models.BigIntegerField(default=0)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "visit", "index"], name="branch_unique"),
            models.CheckConstraint(
                condition=models.Q(status__in=["pending", "running", "done", "failed"]),
                name="branch_status_valid"),
            models.CheckConstraint(condition=models.Q(lease_owner="", lease_expires_at=None) | (
                ~models.Q(lease_owner="") & models.Q(lease_expires_at__isnull=False)),
                name="branch_lease_owner_iff_expiry"),
            models.CheckConstraint(condition=models.Q(
                status__in=["done", "failed"], finished_at__isnull=False) | (
                ~models.Q(status__in=["done", "failed"]) & models.Q(finished_at=None)),
                name="branch_finished_iff_finished_at"),
        ]
