"""Run reads: the one checked path to a run (`run_or_404`), and the lists the API pages through.
A run of another tenant does not exist in this tenant's schema, so it is not_found, never
forbidden."""

from datetime import datetime
from uuid import UUID

from django.db import connection
from django.db.models import Exists, OuterRef, Q, QuerySet, TextField
from django.db.models.functions import Cast

from agentplatform.errors import ServiceError
from runs.approvals.models import Approval, EventGate
from runs.dispatch.models import Wakeup

from .models import Checkpoint, Run, RunEvent

# What a waiting run waits for, read from the rows that hold the wait (not from waiting_reason,
# which is prose): a pending approval, an open event gate, an open gate on a child run, or only
# a wakeup (a sleep: approvals and gates with a timeout have a wakeup too, so those come first).
WAITING_FOR = ("approval", "event", "timer", "child")


def run_or_404(run_id: UUID) -> Run:
    """The run, or ServiceError not_found (the API answers 404)."""
    run = Run.objects.filter(id=run_id).first()
    if run is None:
        raise ServiceError("not_found", "No such run.")
    return run


def run_list(*, statuses: list[str] | None = None, agent: str | None = None,
             version: int | None = None, created_from: datetime | None = None,
             created_to: datetime | None = None, text: str | None = None,
             waiting_for: list[str] | None = None) -> QuerySet[Run]:
    """Runs, filtered by any of `statuses`, agent name, agent version, creation time
    (`created_from` <= created_at < `created_to`), `text` found in the input or the result
    (case-insensitive, in the JSON as text: keys match too) and by what a waiting run waits for
    (any of WAITING_FOR). An unknown status or wait is invalid_filter."""
    runs = Run.objects.all()
    if statuses:
        unknown = set(statuses) - set(Run.Status.values)
        if unknown:
            raise ServiceError("invalid_filter", f"unknown status {sorted(unknown)}")
        runs = runs.filter(status__in=statuses)
    if agent:
        runs = runs.filter(agent=agent)
    if version is not None:
        runs = runs.filter(agent_version=version)
    if created_from is not None:
        runs = runs.filter(created_at__gte=created_from)
    if created_to is not None:
        runs = runs.filter(created_at__lt=created_to)
    if text:
        # jsonb cast to text; icontains escapes LIKE's % and _ in `text`. A scan: fine for a
        # tenant's dashboard, paged and usually narrowed by the other filters.
        runs = runs.alias(input_text=Cast("input", TextField()),
                          result_text=Cast("result", TextField())).filter(
            Q(input_text__icontains=text) | Q(result_text__icontains=text))
    if waiting_for:
        unknown = set(waiting_for) - set(WAITING_FOR)
        if unknown:
            raise ServiceError("invalid_filter", f"unknown wait {sorted(unknown)}")
        runs = runs.filter(status=Run.Status.WAITING).filter(
            _waits_for_any(waiting_for))
    return runs


def _waits_for_any(kinds: list[str]) -> Q:
    approval = Exists(Approval.objects.filter(run=OuterRef("pk"), status=Approval.Status.PENDING))
    gates = EventGate.objects.filter(run=OuterRef("pk"), status=EventGate.Status.OPEN)
    event = Exists(gates.exclude(kind="child_run"))
    child = Exists(gates.filter(kind="child_run"))
    # Wakeups live in public, for every tenant: this tenant's, for this run.
    timer = Exists(Wakeup.objects.filter(schema_name=connection.schema_name,
                                         run_id=OuterRef("pk")))
    waits = {"approval": Q(approval), "event": Q(event), "child": Q(child),
             "timer": Q(timer) & ~Q(approval) & ~Q(Exists(gates))}
    condition = Q()
    for kind in kinds:
        condition |= waits[kind]
    return condition


def run_event_list(*, run_id: UUID) -> QuerySet[RunEvent]:
    return RunEvent.objects.filter(run=run_or_404(run_id))


def checkpoint_list(*, run_id: UUID) -> QuerySet[Checkpoint]:
    return Checkpoint.objects.filter(run=run_or_404(run_id))
