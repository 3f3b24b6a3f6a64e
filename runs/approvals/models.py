"""The approvals inbox and event gates (tenant schema): parked runs waiting for a person or an
event. A parked run is these rows and nothing else: no worker, thread or socket holds it."""

import uuid

from django.db import models
from django.db.models.functions import Now

from runs.models import Run


class Approval(models.Model):
    class Kind(models.TextChoices):
        APPROVAL = "approval"  # wait_for_approval
        EFFECT_OUTCOME = "effect_outcome"  # an effect whose outcome is unknown after a crash
        BUDGET = "budget"  # a model call would exceed the run's budget
        QUOTA = "quota"  # the tenant's monthly token or cost quota is reached (runs.usage)

    class Status(models.TextChoices):
        PENDING = "pending"
        APPROVED = "approved"
        REJECTED = "rejected"
        EXPIRED = "expired"
        CANCELLED = "cancelled"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="approvals")
    visit = models.PositiveIntegerField()  # the checkpoint the run is parked at
    kind = models.CharField(max_length=20, choices=Kind.choices, default=Kind.APPROVAL)
    request = models.JSONField(default=dict)  # title, body, artifact, ...
    deciders = models.JSONField(default=list, blank=True)  # who may decide; empty: anyone
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    then = models.CharField(max_length=100)
    on_timeout = models.CharField(max_length=100, blank=True, default="")
    expires_at = models.DateTimeField(null=True, blank=True)
    decided_by = models.CharField(max_length=200, blank=True, default="")
    comment = models.TextField(blank=True, default="")
    artifact = models.JSONField(null=True, blank=True)  # as approved (possibly edited)
    decided_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["status", "created_at"])]
        constraints = [
            models.CheckConstraint(condition=models.Q(status__in=[
                "pending", "approved", "rejected", "expired", "cancelled"]),
                name="approval_status_valid"),
            models.CheckConstraint(
                condition=models.Q(kind__in=["approval", "effect_outcome", "budget", "quota"]),
                name="approval_kind_valid"),
            # A parked run waits for one thing: a second pending approval would be decided twice.
            models.UniqueConstraint(fields=["run"], condition=models.Q(status="pending"),
                                    name="approval_one_pending_per_run"),
        ]


class EventGate(models.Model):
    """A run waiting for an event of `kind` correlated by `key` (a mailbox, a Slack thread,
    a child run id, ...)."""

    class Status(models.TextChoices):
        OPEN = "open"
        RESOLVED = "resolved"
        EXPIRED = "expired"
        CANCELLED = "cancelled"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="gates")
    visit = models.PositiveIntegerField()
    kind = models.CharField(max_length=64)
    key = models.CharField(max_length=255)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.OPEN)
    then = models.CharField(max_length=100)
    on_timeout = models.CharField(max_length=100, blank=True, default="")
    expires_at = models.DateTimeField(null=True, blank=True)
    # Events received before this are not for this wait (null: any, e.g. bulk-parked runs).
    since = models.DateTimeField(null=True, blank=True)
    event = models.ForeignKey("InboundEvent", null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(auto_now_add=True)
    resolved_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["kind", "key", "status"])]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(status__in=["open", "resolved", "expired", "cancelled"]),
                name="event_gate_status_valid"),
            # A parked run waits for one thing: two open gates could wake it twice.
            models.UniqueConstraint(fields=["run"], condition=models.Q(status="open"),
                                    name="event_gate_one_open_per_run"),
        ]


class InboundEvent(models.Model):
    """Every event that arrived for this tenant, matched or not. `source_id` deduplicates
    (Slack event_id, Pub/Sub messageId, a client's id). An unmatched event is buffered for
    EVENT_BUFFER_SECONDS; the retention job deletes rows after EVENT_DEDUPE_RETENTION_SECONDS."""

    kind = models.CharField(max_length=64)
    key = models.CharField(max_length=255)
    source_id = models.CharField(max_length=255, null=True, blank=True, unique=True)
    payload = models.JSONField(default=dict)
    # When the platform accepted it (a webhook's inbox row), not when a worker stored it; by
    # the database's clock, like the checkpoint times a gate's `since` comes from.
    received_at = models.DateTimeField(db_default=Now())
    consumed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["kind", "key", "consumed_at"]),
                   models.Index(fields=["received_at"], name="inbound_event_received")]
