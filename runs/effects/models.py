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
    # The last failed attempt may have reached the receiver (ConnectorError.sent): only then is
    # a receiver that ignores keys asked (or a person) before the next attempt.
    maybe_sent = models.BooleanField(default=False, db_default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    done_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "scope", "name"],
                                    name="effect_run_scope_name_unique"),
            models.CheckConstraint(
                condition=models.Q(status__in=["pending", "done", "failed", "unknown"]),
                name="effect_status_valid"),
        ]


class OutboxMessage(models.Model):
    """A fire-and-forget notification: committed with the checkpoint of the step that sent it,
    delivered afterwards under a lease (`sending`, `claimed_by` until `claimed_until`); its key
    makes it once at receivers that honour keys, and the others are asked or left to a person."""

    class Status(models.TextChoices):
        PENDING = "pending"  # due at next_attempt_at
        SENDING = "sending"  # claimed: only claimed_by records the outcome, until claimed_until
        DELIVERED = "delivered"
        FAILED = "failed"  # gave up after OUTBOX_MAX_ATTEMPTS, or refused for good
        UNKNOWN = "unknown"  # may have reached a receiver that cannot be asked: a person decides

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="outbox")
    name = models.CharField(max_length=200)
    connector = models.CharField(max_length=40)
    args = models.JSONField(default=dict)
    idempotency_key = models.CharField(max_length=64, unique=True)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0)  # claims taken; fences the outcome
    next_attempt_at = models.DateTimeField()
    claimed_by = models.CharField(max_length=200, blank=True, default="", db_default="")
    claimed_until = models.DateTimeField(null=True, blank=True)
    # An earlier attempt may have reached the receiver (set by every claim, cleared when an
    # attempt failed before sending): a receiver that ignores keys is asked before a resend.
    maybe_sent = models.BooleanField(default=False, db_default=False)
    last_error = models.TextField(blank=True, default="")
    result = models.JSONField(null=True, blank=True)
    settled_by = models.CharField(max_length=200, blank=True, default="", db_default="")
    created_at = models.DateTimeField(auto_now_add=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["status", "next_attempt_at"])]
        constraints = [
            models.CheckConstraint(condition=models.Q(status__in=[
                "pending", "sending", "delivered", "failed", "unknown"]),
                name="outbox_status_valid"),
            models.CheckConstraint(condition=~models.Q(status="sending") | (
                ~models.Q(claimed_by="") & models.Q(claimed_until__isnull=False)),
                name="outbox_sending_has_claim"),
        ]
