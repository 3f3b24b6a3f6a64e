"""Effect and outbox reads: what a run did outside, and the outbox messages the API pages
through (e.g. the ones of unknown outcome waiting for a person)."""

from uuid import UUID

from django.db.models import QuerySet

from agentplatform.errors import ServiceError

from .models import Effect, OutboxMessage


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
