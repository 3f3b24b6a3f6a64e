"""Run reads: the one checked path to a run (`run_or_404`), and the lists the API pages through.
A run of another tenant does not exist in this tenant's schema, so it is not_found, never
forbidden."""

from uuid import UUID

from django.db.models import QuerySet

from agentplatform.errors import ServiceError

from .models import Checkpoint, Run, RunEvent


def run_or_404(run_id: UUID) -> Run:
    """The run, or ServiceError not_found (the API answers 404)."""
    run = Run.objects.filter(id=run_id).first()
    if run is None:
        raise ServiceError("not_found", "No such run.")
    return run


def run_list(*, statuses: list[str] | None = None, agent: str | None = None) -> QuerySet[Run]:
    """Runs, filtered by any of `statuses` and by agent name; an unknown status is invalid_filter."""
    runs = Run.objects.all()
    if statuses:
        unknown = set(statuses) - set(Run.Status.values)
        if unknown:
            raise ServiceError("invalid_filter", f"unknown status {sorted(unknown)}")
        runs = runs.filter(status__in=statuses)
    if agent:
        runs = runs.filter(agent=agent)
    return runs


def run_event_list(*, run_id: UUID) -> QuerySet[RunEvent]:
    return RunEvent.objects.filter(run=run_or_404(run_id))


def checkpoint_list(*, run_id: UUID) -> QuerySet[Checkpoint]:
    return Checkpoint.objects.filter(run=run_or_404(run_id))
