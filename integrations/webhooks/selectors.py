"""Webhook connection reads: a tenant's Slack and Gmail connections, and the connection a
delivery is addressed to (found only while its tenant is active)."""

from uuid import UUID

from django.db.models import QuerySet

from tenants.models import Tenant

from .models import GmailConnection, SlackConnection


def slack_connection_list(*, tenant: Tenant) -> QuerySet[SlackConnection]:
    return SlackConnection.objects.filter(tenant=tenant).order_by("created_at")


def gmail_connection_list(*, tenant: Tenant) -> QuerySet[GmailConnection]:
    return GmailConnection.objects.filter(tenant=tenant).order_by("created_at")


def connection_receiving(*, model: type[SlackConnection] | type[GmailConnection],
                         connection_id: UUID) -> SlackConnection | GmailConnection | None:
    """The connection a webhook names in its URL, or None if there is none or its tenant is
    suspended: either way the sender is told not_found."""
    connection = model.objects.select_related("tenant").filter(id=connection_id).first()
    if connection is None or not connection.tenant.is_active:
        return None
    return connection
