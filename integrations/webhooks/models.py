"""Webhook routing (public schema): which tenant a Slack workspace or Gmail mailbox belongs to,
the ids of deliveries already accepted, and the inbox they are delivered from. A webhook finds
its tenant here before any schema is selected; the work then happens in the tenant's schema,
in a worker."""

import uuid

from django.db import models
from django.db.models.functions import Now

from tenants.models import Tenant


class SlackConnection(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="slack_connections")
    # Unique per tenant, not globally: webhooks route by connection id and verify with that
    # connection's own secret, so nobody can lock another organisation out by claiming its id.
    team_id = models.CharField(max_length=32)
    # AES-256-GCM under the tenant's data key (webhooks.sealing); never in responses or logs.
    signing_secret_sealed = models.BinaryField()
    data_key_version = models.PositiveIntegerField()
    approvals_channel = models.CharField(max_length=32, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "team_id"],
                                               name="slack_connection_tenant_team_unique")]

    def __str__(self) -> str:
        return f"slack {self.team_id} ({self.tenant_id})"


class GmailConnection(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="gmail_connections")
    email = models.EmailField()  # the watched mailbox (Pub/Sub's emailAddress); unique per tenant
    audience = models.CharField(max_length=500)  # the push subscription's OIDC audience
    service_account_email = models.EmailField()  # the push subscription's OIDC identity
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "email"],
                                               name="gmail_connection_tenant_email_unique")]

    def __str__(self) -> str:
        return f"gmail {self.email} ({self.tenant_id})"


class SlackEventSeen(models.Model):
    """One row per accepted Slack event_id: a retry or a replay of it is a duplicate."""

    connection = models.ForeignKey(SlackConnection, on_delete=models.CASCADE, related_name="+")
    event_id = models.CharField(max_length=64)
    received_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["connection", "event_id"],
                                               name="slack_event_seen_unique")]
        indexes = [models.Index(fields=["received_at"], name="slack_event_seen_received")]


class GmailMessageSeen(models.Model):
    """One row per accepted Pub/Sub messageId (Pub/Sub delivers at least once)."""

    connection = models.ForeignKey(GmailConnection, on_delete=models.CASCADE, related_name="+")
    message_id = models.CharField(max_length=128)
    received_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["connection", "message_id"],
                                               name="gmail_message_seen_unique")]
        indexes = [models.Index(fields=["received_at"], name="gmail_message_seen_received")]


class InboxItem(models.Model):
    """The webhook inbox: an accepted delivery (a Slack event, a Slack button decision, a Gmail
    push), stored with its dedupe row before the sender gets its 200 and delivered from here.

    A Celery doorbell carries only the id and the beat sweep finds what a lost doorbell left
    pending, so a broker flush loses nothing; delivery marks the item delivered in the same
    transaction as the tenant work, so it happens once (docs/decisions/0007-webhook-inbox.md)."""

    class Kind(models.TextChoices):
        SLACK_EVENT = "slack_event"
        SLACK_DECISION = "slack_decision"
        GMAIL_PUSH = "gmail_push"

    class Status(models.TextChoices):
        PENDING = "pending"
        DELIVERED = "delivered"
        FAILED = "failed"  # gave up after WEBHOOK_INBOX_MAX_ATTEMPTS; the error is its outcome

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    kind = models.CharField(max_length=20, choices=Kind.choices)
    # Unique per tenant: "slack:<event_id>", "gmail:<messageId>", "slack-decision:<approval>:…"
    source_id = models.CharField(max_length=255)
    payload = models.JSONField()  # the raw Slack event, the decision, the Gmail notification
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    # e.g. approval_closed; for a failed item, the last error
    outcome = models.CharField(max_length=64, blank=True, default="")
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(db_default=Now())
    last_error = models.TextField(blank=True, default="")
    # The database's clock, like the checkpoint times event gates are compared with.
    received_at = models.DateTimeField(db_default=Now())
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "source_id"],
                                    name="inbox_item_tenant_source_unique"),
            models.CheckConstraint(condition=models.Q(status__in=["pending", "delivered", "failed"]),
                                   name="inbox_item_status_valid"),
            models.CheckConstraint(
                condition=models.Q(kind__in=["slack_event", "slack_decision", "gmail_push"]),
                name="inbox_item_kind_valid"),
            models.CheckConstraint(
                condition=~models.Q(status="delivered") | models.Q(delivered_at__isnull=False),
                name="inbox_item_delivered_has_time"),
        ]
        indexes = [
            models.Index(fields=["next_attempt_at"], name="inbox_item_pending_due",
                         condition=models.Q(status="pending")),
            models.Index(fields=["received_at"], name="inbox_item_received"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.source_id} ({self.status})"
