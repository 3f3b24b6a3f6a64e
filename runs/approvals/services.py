"""Parking and waking: approvals, event gates, durable timers, child runs.

The engine calls the `*_open` verbs inside the transaction that parks a run. Everything that
wakes a run (a decision, an event, a due timer) closes what the run waited on and re-queues it
in one transaction, through `runs.services.run_resume`.
"""

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Q
from django.utils import timezone

from agentplatform.db import retried_on_conflict
from runs.dispatch.models import Wakeup
from runs.effects.services import effect_outcome_decide
from runs.events import event_record
from runs.models import Checkpoint, Run
from runs.services import RunError, run_fail_parked, run_resume
from tenants.models import Tenant

from .models import Approval, EventGate, InboundEvent

log = logging.getLogger(__name__)


def wakeup_schedule(*, run_id: UUID, visit: int, due_at) -> None:
    tenant = Tenant.objects.get(schema_name=connection.schema_name)
    Wakeup.objects.update_or_create(
        run_id=run_id, visit=visit,
        defaults={"tenant": tenant, "schema_name": tenant.schema_name, "due_at": due_at},
    )


def wakeup_cancel(*, run_id: UUID) -> None:
    Wakeup.objects.filter(run_id=run_id).delete()


def approval_open(*, run: Run, visit: int, request: dict, then: str, on_timeout: str | None,
                  timeout: timedelta | None, kind: str = Approval.Kind.APPROVAL) -> Approval:
    request = dict(request)
    deciders = request.pop("deciders", [])
    expires_at = timezone.now() + timeout if timeout else None
    approval = Approval.objects.create(
        run=run, visit=visit, kind=kind, request=request, deciders=deciders, then=then,
        on_timeout=on_timeout or "", expires_at=expires_at,
    )
    if expires_at:
        wakeup_schedule(run_id=run.id, visit=visit, due_at=expires_at)

    event_record(run_id=run.id, kind="approval_requested", visit=visit,
                 approval=str(approval.id), title=request.get("title", ""))
    approval_announce(approval_id=approval.id)  # in this transaction: outbox rows commit with it
    return approval


def approval_announce(*, approval_id: UUID) -> None:
    """Tell people an approval waits: each callable in ANNOUNCERS gets the approval id
    (integrations register one that posts Approve / Reject buttons to Slack via the outbox)."""
    for announce in ANNOUNCERS:
        try:
            with transaction.atomic():  # a savepoint: a failing announcer rolls back only itself
                announce(approval_id)
        except Exception:  # an announcement failing must not lose the approval
            log.exception("announcing approval %s failed", approval_id)


ANNOUNCERS: list = []


class ApprovalError(RunError):
    pass


@retried_on_conflict
def approval_decide(*, approval_id: UUID, approve: bool, by: str, comment: str = "",
                    artifact: Any = None, result: Any = None,
                    at: datetime | None = None, identities: Iterable[str] = ()) -> Approval:
    """Close the approval and re-queue its run in one transaction; refuse anything stale.
    `identities`: other names the decider goes by in `deciders` (a dashboard user is
    `user:<email>`, their bare email and `role:<role>`); `by` is what is recorded.
    `result`: for an "outcome unknown" approval answered "delivered", what the step reads.
    `at`: when the platform accepted the decision (a webhook's inbox item), if not now; the
    approval's expiry is checked against it."""
    with transaction.atomic():
        run_id = Approval.objects.filter(id=approval_id).values_list("run_id", flat=True).first()
        if run_id is None:
            raise ApprovalError("not_found", "No such approval.")
        run = Run.objects.select_for_update().filter(id=run_id).first()  # first (decision 0008)
        if run is None:  # archived since the read above: its approvals are closed history
            raise ApprovalError("not_found", "No such approval.")
        approval = Approval.objects.select_for_update().get(id=approval_id)
        if approval.status != Approval.Status.PENDING:
            raise ApprovalError("approval_closed", f"This approval is already {approval.status}.")
        if approval.expires_at and approval.expires_at <= (at or timezone.now()):
            raise ApprovalError("approval_expired", "This approval has expired.")
        if approval.deciders and not {by, *identities} & set(approval.deciders):
            raise ApprovalError("not_a_decider", f"{by} may not decide this approval.")
        if result is not None and not (approve and approval.kind == Approval.Kind.EFFECT_OUTCOME):
            raise ApprovalError("result_not_allowed", "A result is given only when approving "
                                "that an effect of unknown outcome was delivered.")
        if run.status != Run.Status.WAITING:
            raise ApprovalError("run_not_waiting", f"The run is {run.status}.")
        approval.status = Approval.Status.APPROVED if approve else Approval.Status.REJECTED
        approval.decided_by, approval.comment = by, comment
        approval.artifact = artifact if artifact is not None else approval.request.get("artifact")
        approval.decided_at = timezone.now()
        approval.save()
        decision = {"approved": approve, "by": by, "comment": comment,
                    "artifact": approval.artifact, "approval": str(approval.id)}
        if approval.kind == Approval.Kind.APPROVAL:
            run_resume(run_id=run.id, held=run, visit=approval.visit, step=approval.then,
                       update={"approval": decision}, event="approval_decided", **decision)
        elif approval.kind == Approval.Kind.BUDGET and not approve:
            event_record(run_id=run.id, kind="approval_decided", **decision)
            run_fail_parked(run_id=run.id, reason=f"budget exceeded; not raised by {by}")
        elif approval.kind == Approval.Kind.QUOTA and not approve:
            event_record(run_id=run.id, kind="approval_decided", **decision)
            run_fail_parked(run_id=run.id, reason=f"the tenant's {approval.request.get('quota')} "
                            f"quota is reached; not raised by {by}")
        else:  # the step runs again at the same visit, with the person's answer applied
            # (a quota approved: the approval itself lets this run past the quota this month)
            _settle(approval, run, approve=approve, by=by, result=result)
            run_resume(run_id=run.id, visit=approval.visit, step=None, update={},
                       event="approval_decided", **decision)
    return approval


def _settle(approval: Approval, run: Run, *, approve: bool, by: str, result: Any = None) -> None:
    if approval.kind == Approval.Kind.EFFECT_OUTCOME:
        effect_outcome_decide(run_id=run.id, request=approval.request, delivered=approve, by=by,
                              result=result)
    elif approval.kind == Approval.Kind.BUDGET:  # approved: double what ran out
        updates = {}
        if run.max_tokens is not None:
            updates["max_tokens"] = run.max_tokens * 2
        if run.max_cost_usd is not None:
            updates["max_cost_usd"] = run.max_cost_usd * 2
        Run.objects.filter(id=run.id).update(**updates)


def gate_open(*, run: Run, visit: int, kind: str, key: str, then: str, on_timeout: str | None,
              timeout: timedelta | None, since: datetime | None = None) -> EventGate:
    """Open a gate; an event that arrived before the run parked is matched now (no lost
    wake-up: the event row and this check are serialised by the row lock on the event).

    Only events received since the wait began count: since the run reached the waiting step
    (its checkpoint before `visit`, so a step re-run after a crash or a person's answer still
    sees the reply to what it sent the first time), or since `since` if that is earlier. An
    unmatched event older than EVENT_BUFFER_SECONDS never counts. Times are the database's
    clock, like the checkpoints' and the events' (a worker's clock may be off)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement_timestamp()")
        now = cursor.fetchone()[0]
    expires_at = now + timeout if timeout else None
    reached = (Checkpoint.objects.filter(run_id=run.id, visit__lt=visit).order_by("-visit")
               .values_list("created_at", flat=True).first())
    begun = min(t for t in (since, reached, now) if t is not None)
    _correlation_lock(kind, key)
    gate = EventGate.objects.create(run=run, visit=visit, kind=kind, key=key, then=then,
                                    on_timeout=on_timeout or "", expires_at=expires_at,
                                    since=begun)
    buffered = now - timedelta(seconds=settings.EVENT_BUFFER_SECONDS)
    early = (InboundEvent.objects.select_for_update()
             .filter(kind=kind, key=key, consumed_at=None, received_at__gte=max(begun, buffered))
             .order_by("received_at").first())
    if early is not None:
        _gate_resolve(gate, early)
    elif expires_at:
        wakeup_schedule(run_id=run.id, visit=visit, due_at=expires_at)
    return gate


@dataclass
class Delivery:
    event: InboundEvent | None
    duplicate: bool = False
    resumed: list[UUID] = field(default_factory=list)


@retried_on_conflict
def event_deliver(*, kind: str, key: str, payload: dict, source_id: str | None = None,
                  received_at: datetime | None = None) -> Delivery:
    """Record an event and wake every run whose open gate matches. Idempotent by source_id.
    `received_at`: when the platform accepted it (a webhook's inbox item), if not now (the
    database's clock); a gate whose wait began later does not take it."""
    accepted = {"received_at": received_at} if received_at else {}
    with transaction.atomic():
        _correlation_lock(kind, key)
        try:
            with transaction.atomic():
                event = InboundEvent.objects.create(kind=kind, key=key, payload=payload,
                                                    source_id=source_id or None, **accepted)
        except IntegrityError:
            return Delivery(InboundEvent.objects.filter(source_id=source_id).first(),
                            duplicate=True)
        gates = list(EventGate.objects.filter(kind=kind, key=key, status=EventGate.Status.OPEN)
                     .filter(Q(since=None) | Q(since__lte=event.received_at))
                     .order_by("run_id", "id"))  # locked in _gate_resolve, after their run
        resumed = []
        for gate in gates:
            if _gate_resolve(gate, event):
                resumed.append(gate.run_id)
    return Delivery(event, resumed=resumed)


# Events the platform delivers itself (a child run's end, Slack, Gmail) and the dedupe ids it
# gives them: from a tenant's program, one would forge a child's result or pre-empt a webhook.
PLATFORM_EVENT_KINDS = ("child_run", "slack", "gmail")  # and "<kind>.<anything>"
PLATFORM_EVENT_ID_PREFIXES = ("child:", "slack:", "slack-decision:", "gmail:")


def event_submit(*, kind: str, key: str, payload: dict, source_id: str | None = None) -> Delivery:
    """An event from a tenant's program (`POST /events`): delivered like any other, except that
    the platform's own kinds and dedupe ids are refused (403)."""
    if any(kind == own or kind.startswith(f"{own}.") for own in PLATFORM_EVENT_KINDS):
        raise ApprovalError("reserved_event_kind",
                            f"Events of kind {kind!r} are delivered by the platform itself.")
    if source_id and source_id.startswith(PLATFORM_EVENT_ID_PREFIXES):
        raise ApprovalError("reserved_event_id",
                            f"Event ids starting with {source_id.split(':')[0]}: are the "
                            "platform's own.")
    return event_deliver(kind=kind, key=key, payload=payload, source_id=source_id)


def inbound_events_prune(*, now: datetime | None = None) -> int:
    """Delete this tenant's inbound events older than EVENT_DEDUPE_RETENTION_SECONDS (and the
    buffer): past every sender's retry window, their source_id no longer needs deduplicating,
    and the runs they woke hold their payload in state."""
    keep = max(settings.EVENT_DEDUPE_RETENTION_SECONDS, settings.EVENT_BUFFER_SECONDS)
    cutoff = (now or timezone.now()) - timedelta(seconds=keep)
    return InboundEvent.objects.filter(received_at__lt=cutoff).delete()[0]


def _correlation_lock(kind: str, key: str) -> None:
    """Serialise a gate opening and an event arriving for the same (kind, key): without it each
    could commit unseen by the other, and the run would wait for an event already stored."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                       [f"{connection.schema_name}\x1f{kind}\x1f{key}"])


def _gate_resolve(gate: EventGate, event: InboundEvent) -> bool:
    run = Run.objects.select_for_update().get(id=gate.run_id)
    gate = EventGate.objects.select_for_update().get(id=gate.id)  # the run row first (0008)
    if run.status != Run.Status.WAITING or gate.status != EventGate.Status.OPEN:
        return False
    gate.status, gate.event, gate.resolved_at = EventGate.Status.RESOLVED, event, timezone.now()
    gate.save(update_fields=["status", "event", "resolved_at"])
    InboundEvent.objects.filter(id=event.id, consumed_at=None).update(consumed_at=timezone.now())
    run_resume(run_id=run.id, held=run, visit=gate.visit, step=gate.then,
               update={"event": {"kind": event.kind, "key": event.key, "payload": event.payload}},
               event="event_received", event_kind=event.kind, event_key=event.key)
    return True


@retried_on_conflict
def wakeup_fire(*, run_id: UUID, visit: int) -> str:
    """A due time came: expire what the run waits on and take its timeout path, or end a sleep.
    Stale wakeups (the run moved on) do nothing."""
    with transaction.atomic():
        run = Run.objects.select_for_update().filter(id=run_id).first()
        if run is None or run.status != Run.Status.WAITING:
            return "stale"
        approval = Approval.objects.select_for_update().filter(
            run_id=run_id, visit=visit, status=Approval.Status.PENDING).first()
        gate = EventGate.objects.select_for_update().filter(
            run_id=run_id, visit=visit, status=EventGate.Status.OPEN).first()
        if not Wakeup.objects.select_for_update().filter(
                run_id=run_id, visit=visit, due_at__lte=timezone.now()).exists():
            return "stale"  # fired already (another tick), or the run parked again since
        waiting_on = approval or gate
        if waiting_on is None:  # a sleep: the parked checkpoint already points at `then`
            return "woke" if run_resume(run_id=run_id, held=run, visit=visit, step=None, update={},
                                        event="timer_fired") else "stale"
        waiting_on.status = "expired"
        waiting_on.save(update_fields=["status"])
        what = "approval" if approval else "event"
        if not waiting_on.on_timeout:
            run_fail_parked(run_id=run_id, reason=f"{what} timed out and the step declared no "
                                                  "on_timeout step")
            return "failed"
        run_resume(run_id=run_id, held=run, visit=visit, step=waiting_on.on_timeout,
                   update={"timed_out": {"waiting_for": what}}, event="wait_timed_out",
                   waiting_for=what)
        return "timed_out"


def parked_cancel(*, run_id: UUID) -> None:
    """A cancelled run waits for nothing any more."""
    Approval.objects.filter(run_id=run_id, status=Approval.Status.PENDING).update(
        status=Approval.Status.CANCELLED)
    EventGate.objects.filter(run_id=run_id, status=EventGate.Status.OPEN).update(
        status=EventGate.Status.CANCELLED)
    wakeup_cancel(run_id=run_id)
