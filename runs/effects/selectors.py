"""Effect and outbox reads: what a run did outside, and the outbox messages the API pages
through (e.g. the ones of unknown outcome waiting for a person)."""

from uuid import UUID

from django.db import connection
from django.db.models import QuerySet

from agentplatform.errors import ServiceError
from agentplatform.metrics import OutboxBacklog
from tenants.models import Tenant

from .models import Effect, OutboxMessage

OUTBOX_BACKLOG_SCHEMAS_PER_QUERY = 200


def effect_list(*, run_id: UUID) -> QuerySet[Effect]:
    """A run's effects, in the order it recorded them."""
    return Effect.objects.filter(run_id=run_id).order_by("id")


def outbox_list(*, status: str | None = None, run_id: UUID | None = None) -> QuerySet[OutboxMessage]:
    """Outbox messages, filtered by status and run; an unknown status is invalid_filter."""
    messages = OutboxMessage.objects.all()
    if status:
        if status not in OutboxMessage.Status.values:
            raise ServiceError("invalid_filter", f"unknown status {status!r}")
        messages = messages.filter(status=status)
    if run_id:
        messages = messages.filter(run_id=run_id)
    return messages


def outbox_backlog() -> OutboxBacklog:
    """Undelivered messages of every provisioned tenant (each schema's table, through its
    (status, next_attempt_at) index), a few hundred schemas per statement."""
    schemas = list(Tenant.objects.exclude(provisioned_at=None).exclude(schema_name="public")
                   .order_by("id").values_list("schema_name", flat=True))
    counts = {"pending": 0, "sending": 0, "unknown": 0}
    oldest = 0.0
    table = OutboxMessage._meta.db_table
    for start in range(0, len(schemas), OUTBOX_BACKLOG_SCHEMAS_PER_QUERY):
        chunk = schemas[start:start + OUTBOX_BACKLOG_SCHEMAS_PER_QUERY]
        union = " UNION ALL ".join(
            f"""SELECT status, count(*), extract(epoch FROM now() - min(created_at))
                  FROM "{schema}".{table} WHERE status IN ('pending', 'sending', 'unknown')
                 GROUP BY status""" for schema in chunk)
        with connection.cursor() as cursor:
            cursor.execute(union)
            for status, count, age in cursor.fetchall():
                counts[status] += count
                if status != "unknown":
                    oldest = max(oldest, float(age or 0))
    return OutboxBacklog(**counts, oldest_seconds=oldest)
