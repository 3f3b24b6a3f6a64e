"""The effect ledger and the outbox (tenant schema): every externally visible operation of a
run, keyed on (run, step visit, name), so it happens once however often its step runs."""

from django.db import models

from runs.models import Run


class Effect(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending"  # committed before the call; after a crash: maybe sent
        DONE = "done"
        FAILED = "failed"
        UNKNOWN = "unknown"  # a receiver that ignores keys can't tell us: a person decides

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="effects",
                            db_index=False)  # the unique (run, scope, name) index serves it
    scope = models.CharField(max_length=40)  # the step visit ("7"), or a branch's ("7/b3")
    name = models.CharField(max_length=200)
    connector = models.CharField(max_length=40)
    args = models.JSONField(default=dict)
    args_hash = models.CharField(max_length=64)
    idempotency_key = models.CharField(max_length=64, unique=True)
    status = models.CharField(max_length=8, choices=Status.choices, default=Status.PENDING)
    result = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    retryable = models.BooleanField(default=False)
    attempts = models.PositiveIntegerField(default=0)  # calls started (committed before each)
    created_at = models.DateTimeField(auto_now_add=True)
    done_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "scope", "name"],
                                               name="effect_run_scope_name_unique")]


class OutboxMessage(models.Model):
    """A fire-and-forget notification: committed with the checkpoint of the step that sent it,
    delivered at least once by the dispatcher; its key makes it once at the receiver."""

    class Status(models.TextChoices):
        PENDING = "pending"
        DELIVERED = "delivered"
        FAILED = "failed"  # gave up after OUTBOX_MAX_ATTEMPTS

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="outbox")
    name = models.CharField(max_length=200)
    connector = models.CharField(max_length=40)
    args = models.JSONField(default=dict)
    idempotency_key = models.CharField(max_length=64, unique=True)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField()
    last_error = models.TextField(blank=True, default="")
    result = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["status", "next_attempt_at"])]
