"""Webhook routing (public schema): which tenant a Slack workspace or Gmail mailbox belongs to,
and the ids of deliveries already accepted. A webhook finds its tenant here before any schema
is selected; the work then happens in the tenant's schema, in a worker."""

import uuid

from django.db import models

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


class GmailMessageSeen(models.Model):
    """One row per accepted Pub/Sub messageId (Pub/Sub delivers at least once)."""

    connection = models.ForeignKey(GmailConnection, on_delete=models.CASCADE, related_name="+")
    message_id = models.CharField(max_length=128)
    received_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["connection", "message_id"],
                                               name="gmail_message_seen_unique")]
