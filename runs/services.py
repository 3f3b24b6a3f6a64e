"""Run verbs: start, cancel, fork, re-queue, migrate, and reading the state at a checkpoint
(time travel)."""

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import DatabaseError, IntegrityError, connection, transaction
from django.db.models import F
from django.utils import timezone

from agentplatform.db import retried_on_conflict
from agentplatform.errors import ServiceError
from agentplatform.metrics import run_finished_count, run_started_count
from agentplatform.rows import rows_insert
from runs.approvals.models import Approval, EventGate
from runs.definitions.models import AgentDefinition
from runs.dispatch.models import Wakeup
from runs.dispatch.services import dispatch_after_commit, dispatch_ready, ready_clear, ready_mark
from runs.usage.quotas import quota_check_start

from .agents import UnknownAgent, registry
from .events import event_record, event_row
from .models import Branch, Checkpoint, LogEntry, Run
from .parked import inbox
from .state import StateTooLarge, state_merge

log = logging.getLogger(__name__)


class RunError(ServiceError):
    """A run operation that cannot be done; `code` is stable, `message` is for a person."""


@dataclass(frozen=True)
class Started:
    run: Run
    created: bool


def run_enqueue(run_id: UUID, *, now: bool = False) -> None:
    """Put the run in line, in the caller's transaction; the dispatcher hands it out once that
    commits (one dispatch per transaction), and its task is the only hop to a worker (decision
    0025). `now`: the caller commits right after this and holds nothing another transaction
    can wait for (run_start: a new run's rows, seen by nobody else until it commits): hand it
    out inside the transaction, waiting for the dispatcher's lock if another holds it (up to
    DISPATCH_LOCK_WAIT_SECONDS), which saves the dispatch a transaction of its own, the lock
    then held only until that commit."""
    ready_mark(run_id=run_id)
    if now:
        try:
            if dispatch_ready(robust=True, wait=True) is not None:
                return
        except DatabaseError:  # a deadlock's victim (runs.tasks.advance): its savepoint alone
            if connection.needs_rollback:  # the transaction itself is broken: the start fails
                raise
            log.warning("run %s: handed out after its commit instead", run_id, exc_info=True)
    dispatch_after_commit()


def run_start(*, agent: str, version: int | None = None, input: dict[str, Any] | None = None,
              durability: str = Run.Durability.SYNC, max_steps: int | None = None,
              max_wall_seconds: float | None = None, max_tokens: int | None = None,
              max_cost_usd=None, idempotency_key: str | None = None,
              parent_id: UUID | None = None, enqueue: bool = True, by: str = "",
              now: datetime | None = None) -> Started:
    """Create a run pinned to the agent's current code, with its first checkpoint (visit 0).
    The input must match the agent's input schema, if it has one (invalid_input, naming each
    failing path). `by`: who started it, in its run_created event.

    A tenant over a quota starts no run (quota_exceeded, runs.usage.quotas); a child run is
    its parent's work, already admitted, and is not refused. `now`: the quotas' clock.

    A reused idempotency key returns the run it created, if the request was the same.
    """
    input = input or {}
    if not isinstance(input, dict):
        raise RunError("invalid_input", "input must be a JSON object")
    if idempotency_key:
        existing = Run.objects.filter(idempotency_key=idempotency_key).first()
        if existing is not None:
            return Started(_same_request(existing, agent, version, input, durability),
                           created=False)
    try:
        definition = registry.get(agent, version)
    except UnknownAgent as exc:
        if version is None and _retired(agent):
            raise RunError("agent_retired", f"the agent {agent!r} is retired: it starts no new "
                           "runs") from None
        raise RunError("unknown_agent", str(exc)) from None
    if definition.kind == "tenant" and _retired(definition.name, definition.version):
        raise RunError("agent_retired", f"{definition.name} v{definition.version} is retired: it starts "
                       "no new runs (its runs still finish)")
    if durability not in Run.Durability.values:
        raise RunError("invalid_durability", f"durability must be one of {Run.Durability.values}")
    problems = definition.input_errors(input)
    if problems:
        raise RunError("invalid_input", f"input does not match {definition.name}'s input "
                       f"schema: {'; '.join(problems)}")
    try:
        state = state_merge({}, input)
    except StateTooLarge as exc:
        raise RunError("state_too_large", str(exc)) from None
    limits = {"max_steps": max_steps, "max_wall_seconds": max_wall_seconds,
              "max_tokens": max_tokens, "max_cost_usd": max_cost_usd}
    for key, default in (definition.limits or {}).items():  # the agent's, where the caller set none
        if limits.get(key) is None:
            limits[key] = default
    commits_here = not connection.in_atomic_block  # else the caller goes on after this
    try:
        with transaction.atomic():
            if parent_id is None:  # in the transaction that counts the run: see the lock there
                quota_check_start(now=now)
            run = Run(
                agent=definition.name, agent_version=definition.version,
                topology_hash=definition.topology_hash, durability=durability, input=input,
                idempotency_key=idempotency_key or None, parent_id=parent_id,
                **{k: v for k, v in limits.items() if v is not None},
            )
            rows_insert(  # one statement: the run, its first checkpoint, its first event
                run,
                Checkpoint(run=run, visit=0, step=definition.start, state=state, log_offsets={},
                           agent_version=run.agent_version, topology_hash=run.topology_hash),
                event_row(run_id=run.id, kind="run_created", visit=0, agent=run.agent,
                          version=run.agent_version, durability=durability,
                          **({"by": by} if by else {})),
            )
            run_started_count()
            if enqueue:
                run_enqueue(run.id, now=commits_here)  # last: it may hold the dispatcher's lock
    except IntegrityError:
        # Two requests raced on one idempotency key: the first one's run is the answer. (With
        # no key it is another rule, say a parent that is gone: `idempotency_key=None` would
        # match any run without a key.)
        existing = Run.objects.filter(idempotency_key=idempotency_key).first() \
            if idempotency_key else None
        if existing is None:
            raise
        return Started(_same_request(existing, agent, version, input, durability),
                       created=False)
    return Started(run, created=True)


def _retired(name: str, version: int | None = None) -> bool:
    """Whether the tenant retired its agent `name` (that version, or some version): a tenant's
    definitions live in its schema, so outside one there are none."""
    if connection.schema_name in ("", "public"):
        return False
    rows = AgentDefinition.objects.filter(name=name, retired_at__isnull=False)
    return (rows if version is None else rows.filter(version=version)).exists()


def _same_request(run: Run, agent: str, version: int | None, input: dict,
                  durability: str) -> Run:
    # (its budgets are not compared: a person may have raised them since)
    if run.agent != agent or run.input != input or version not in (None, run.agent_version) \
            or run.durability != durability:
        raise RunError(
            "idempotency_key_reused",
            "this Idempotency-Key was used for a different request; use a new key",
        )
    return run


@retried_on_conflict
def run_cancel(*, run_id: UUID, by: str = "") -> Run:
    """Cancel the run and every unfinished run it started (and theirs): now if no worker runs
    it, otherwise at the running step's end (or as it parks: cancel wins). `by`: who asked, in
    the root run's events (`api:<key name>`, `user:<email>`)."""
    with transaction.atomic():
        tree = _unfinished_descendants(run_id)
        # Lock order (docs/decisions/0008): children before their parents, as a child's end
        # locks itself and then reports to its parent.
        for descendant_id in reversed(tree):
            Run.objects.select_for_update().filter(id=descendant_id).first()
        run = Run.objects.select_for_update().filter(id=run_id).first()
        if run is None:
            raise RunError("not_found", "no such run")
        if run.is_finished:
            raise RunError("run_finished", f"run is already {run.status}")
        # Read again under the root's lock: a child its worker started while we waited (the
        # parking transaction held the root) is committed now. A deadlock this may cause
        # with that child's end is retried, reading the tree anew.
        tree = _unfinished_descendants(run_id)
        for descendant_id in reversed(tree):
            Run.objects.select_for_update().filter(id=descendant_id).first()
        _cancel_locked(run, by=by)
        for descendant in Run.objects.filter(id__in=tree).exclude(status__in=Run.FINISHED):
            _cancel_locked(descendant, by=by)
    run.refresh_from_db()
    return run


def _unfinished_descendants(run_id: UUID) -> list[UUID]:
    """The unfinished runs below `run_id`, parents before their children."""
    found, level = [], [run_id]
    while level:
        level = list(Run.objects.filter(parent_id__in=level).exclude(status__in=Run.FINISHED)
                     .order_by("id").values_list("id", flat=True))
        found += level
    return found


def _cancel_locked(run: Run, *, by: str = "") -> None:
    who = {"by": by} if by else {}
    now = timezone.now()
    if run.status == Run.Status.RUNNING and (run.lease_expires_at is None
                                             or run.lease_expires_at > now):
        # its worker ends it at the next step boundary
        Run.objects.filter(id=run.id).update(cancel_requested=True)
        event_record(run_id=run.id, kind="cancel_requested", **who)
        return
    # Not running, or running on a lease that expired: no live worker would see the request
    # (the lease of a stuck run is not taken over), so it ends now, its last holder fenced off.
    Run.objects.filter(id=run.id).update(
        status=Run.Status.CANCELLED, cancel_requested=True, finished_at=now,
        lease_owner="", lease_expires_at=None, waiting_reason="",
        **({"lease_epoch": F("lease_epoch") + 1} if run.status == Run.Status.RUNNING else {}),
    )
    Branch.objects.filter(run=run, status=Branch.Status.PENDING).update(
        status=Branch.Status.FAILED, error="run cancelled", finished_at=now)
    inbox().parked_cancel(run_id=run.id)  # approvals, gates, wakeups: the order in decision 0008
    ready_clear(run_id=run.id)
    event_record(run_id=run.id, kind="run_cancelled", **who)
    run_finished_count(status=Run.Status.CANCELLED)
    child_report(run_id=run.id, status=Run.Status.CANCELLED, error="cancelled")


def checkpoint_state(*, run_id: UUID, visit: int) -> dict[str, Any]:
    """Time travel: the run's step, small state and log prefixes as of checkpoint `visit`."""
    checkpoint = Checkpoint.objects.filter(run_id=run_id, visit=visit).first()
    if checkpoint is None:
        raise RunError("not_found", f"run has no checkpoint at visit {visit}")
    logs: dict[str, list] = {name: [] for name in checkpoint.log_offsets}
    for name, offset in checkpoint.log_offsets.items():
        logs[name] = list(
            LogEntry.objects.filter(run_id=run_id, log=name, index__lt=offset)
            .order_by("index").values_list("value", flat=True)
        )
    return {"visit": checkpoint.visit, "step": checkpoint.step, "state": checkpoint.state,
            "logs": logs, "agent_version": checkpoint.agent_version,
            "created_at": checkpoint.created_at}


def run_fork(*, run_id: UUID, visit: int, durability: str | None = None,
             enqueue: bool = True, by: str = "", idempotency_key: str | None = None) -> Run:
    """A new run that starts from checkpoint `visit` of a finished run, which stays untouched.

    Where the run parked (or at the checkpoint its wake-up wrote, which holds the answer) the
    fork waits again: a new approval for the same deciders, a new gate, a new timer, a new
    child run; at a fan-out join it gets the branch results. It never inherits a decision.

    A reused idempotency key returns the fork it made (a fork's effects are new: a second one
    would perform them again), if it was of the same run and visit. A fork is a new run: a
    tenant over a start quota makes none (quota_exceeded).
    """
    if idempotency_key:
        existing = Run.objects.filter(idempotency_key=idempotency_key).first()
        if existing is not None:
            return _same_fork(existing, run_id, visit)
    try:
        return _fork(run_id=run_id, visit=visit, durability=durability, enqueue=enqueue, by=by,
                     idempotency_key=idempotency_key or None)
    except IntegrityError:  # two requests raced on one key: the first one's fork is the answer
        existing = Run.objects.filter(idempotency_key=idempotency_key).first() \
            if idempotency_key else None
        if existing is None:
            raise
        return _same_fork(existing, run_id, visit)


def _same_fork(run: Run, source_id: UUID, visit: int) -> Run:
    if run.forked_from_id != source_id or run.forked_from_visit != visit:
        raise RunError("idempotency_key_reused",
                       "this idempotency key was used for a different request; use a new key")
    return run


def _fork(*, run_id: UUID, visit: int, durability: str | None, enqueue: bool, by: str,
          idempotency_key: str | None) -> Run:
    source = Run.objects.filter(id=run_id).first()
    if source is None:
        raise RunError("not_found", "no such run")
    if not source.is_finished:
        raise RunError("run_not_finished", f"only finished runs can be forked; this one is {source.status}")
    checkpoint = Checkpoint.objects.filter(run_id=run_id, visit=visit).first()
    if checkpoint is None:
        raise RunError("not_found", f"run has no checkpoint at visit {visit}")
    if checkpoint.step is None:
        raise RunError("checkpoint_ended", "this checkpoint is the run's end; there is nothing to run")
    woken_from = (checkpoint.waiting or {}).get("woken_from")
    if woken_from is not None:  # its state holds the decision or event: wait for a new one
        checkpoint = Checkpoint.objects.filter(run_id=run_id, visit=woken_from).first()
        if checkpoint is None:  # shallow history kept only the woken checkpoint
            raise RunError("checkpoint_compacted", f"the checkpoint this one woke from "
                           f"({woken_from}) was compacted away; fork from another checkpoint")
    waiting = {k: v for k, v in (checkpoint.waiting or {}).items() if k != "woken_from"}
    branches = list(Branch.objects.filter(run_id=run_id, visit=checkpoint.visit).order_by("index"))
    reopens = waiting.get("kind") in ("approval", "event", "timer", "child_run") or bool(branches)
    with transaction.atomic():
        quota_check_start()  # a fork is a new run of the tenant's: admitted as a start is
        fork = Run.objects.create(
            agent=source.agent, agent_version=source.agent_version,
            topology_hash=source.topology_hash, durability=durability or source.durability,
            input=source.input, max_steps=source.max_steps,
            max_wall_seconds=source.max_wall_seconds, **_budget_as_started(source),
            steps_taken=checkpoint.visit, forked_from=source, forked_from_visit=visit,
            idempotency_key=idempotency_key,
            status=Run.Status.WAITING if reopens else Run.Status.QUEUED,
            waiting_reason=waiting.get("reason", "") if reopens else "",
        )
        Checkpoint.objects.create(
            run=fork, visit=checkpoint.visit, step=checkpoint.step, state=checkpoint.state,
            log_offsets=checkpoint.log_offsets, agent_version=checkpoint.agent_version,
            topology_hash=checkpoint.topology_hash, waiting=waiting or None,
        )
        for name, offset in checkpoint.log_offsets.items():
            entries = LogEntry.objects.filter(run_id=run_id, log=name, index__lt=offset)
            LogEntry.objects.bulk_create(
                LogEntry(run=fork, log=name, index=e.index, visit=e.visit, value=e.value)
                for e in entries.iterator()
            )
        event_record(run_id=fork.id, kind="run_forked", visit=checkpoint.visit,
                     source=str(source.id), source_visit=visit, **({"by": by} if by else {}))
        if branches:
            _fork_branches(fork, branches, enqueue=enqueue)
        elif reopens:
            _fork_wait(fork, checkpoint.visit, waiting, enqueue=enqueue)
        elif enqueue:
            run_enqueue(fork.id)
    fork.refresh_from_db()
    return fork


def _fork_wait(fork: Run, visit: int, waiting: dict, *, enqueue: bool) -> None:
    """Open in the fork the wait its source parked on at `visit`, anew."""
    parking = inbox()

    def seconds(value):
        return timedelta(seconds=value) if value else None

    event_record(run_id=fork.id, kind="run_parked", visit=visit, reason=waiting.get("reason", ""))
    match waiting:
        case {"kind": "approval"}:
            parking.approval_open(
                run=fork, visit=visit, request={**waiting["request"], "deciders": waiting["deciders"]},
                then=waiting["then"], on_timeout=waiting["on_timeout"],
                timeout=seconds(waiting["timeout"]))
        case {"kind": "event"}:
            parking.gate_open(run=fork, visit=visit, kind=waiting["event_kind"],
                              key=waiting["key"], then=waiting["then"],
                              on_timeout=waiting["on_timeout"], timeout=seconds(waiting["timeout"]))
        case {"kind": "timer"}:
            due = (timezone.now() + seconds(waiting["duration"]) if waiting["duration"]
                   else datetime.fromisoformat(waiting["due"]))
            parking.wakeup_schedule(run_id=fork.id, visit=visit, due_at=due)
        case {"kind": "child_run"}:
            child = run_start(agent=waiting["agent"], version=waiting["version"],
                              input=waiting["input"], parent_id=fork.id,
                              durability=fork.durability, enqueue=enqueue).run
            parking.gate_open(run=fork, visit=visit, kind="child_run", key=str(child.id),
                              then=waiting["then"], on_timeout=None, timeout=None)


def _fork_branches(fork: Run, branches: list[Branch], *, enqueue: bool) -> None:
    """At a fan-out join: the fork gets the results of the branches that succeeded; the others
    run again, for the fork."""
    Branch.objects.bulk_create(
        Branch(run=fork, visit=b.visit, index=b.index, step=b.step, item=b.item,
               **({"status": b.status, "result": b.result, "attempts": b.attempts,
                   "finished_at": b.finished_at} if b.status == Branch.Status.DONE else {}))
        for b in branches
    )
    again = [b.index for b in branches if b.status != Branch.Status.DONE]
    if not again:  # every result is there: on to the join step
        Run.objects.filter(id=fork.id).update(status=Run.Status.QUEUED, waiting_reason="")
        if enqueue:
            run_enqueue(fork.id)
    elif enqueue:
        for index in again:
            ready_mark(run_id=fork.id, branch=index)
        dispatch_after_commit()


def _budget_as_started(run: Run) -> dict[str, Any]:
    """The run's token and cost budgets before any person raised them: a raise is a decision,
    and a fork inherits none."""

    raises = Approval.objects.filter(run_id=run.id, kind=Approval.Kind.BUDGET,
                                     status=Approval.Status.APPROVED).count()
    return {"max_tokens": None if run.max_tokens is None else run.max_tokens // 2 ** raises,
            "max_cost_usd": None if run.max_cost_usd is None else run.max_cost_usd / 2 ** raises}


def runs_inspect_in_flight(*, rows, now) -> list[str]:
    """For the watchdog: per ready row handed to a worker a while ago, in this tenant's schema,
    say "requeue" (lost message or expired lease), "drop" (the run left) or "keep"."""
    redeliver = now - timedelta(seconds=settings.DISPATCH_REDELIVER_SECONDS)
    run_ids = {row.run_id for row in rows}
    runs = {r.id: r for r in Run.objects.filter(id__in=run_ids)}
    branches = {(b.run_id, b.index): b for b in Branch.objects.filter(run_id__in=run_ids)
                .order_by("visit")}  # the latest visit wins
    verdicts = []
    for row in rows:
        if row.branch < 0:
            run = runs.get(row.run_id)
            status, expires = (run.status, run.lease_expires_at) if run else (None, None)
            running, queued = Run.Status.RUNNING, Run.Status.QUEUED
        else:
            branch = branches.get((row.run_id, row.branch))
            status, expires = (branch.status, branch.lease_expires_at) if branch else (None, None)
            running, queued = Branch.Status.RUNNING, Branch.Status.PENDING
        if status == running and expires is not None and expires < now:
            verdicts.append("requeue")
            if row.branch < 0:
                event_record(run_id=row.run_id, kind="lease_expired", owner=run.lease_owner,
                             epoch=run.lease_epoch)
        elif status == queued or (status == running and expires is None):
            verdicts.append("requeue" if row.dispatched_at < redeliver else "keep")
        elif status == running:
            verdicts.append("keep")
        else:
            verdicts.append("drop")
    return verdicts


def run_requeue(*, run_id: UUID, by: str) -> Run:
    """Operator action for a stuck run: fence off whoever holds it (epoch + 1) and put it back
    in line. Its next worker resumes from the last checkpoint."""

    with transaction.atomic():
        # The run's row first: a run parking right now holds it until its approval or gate is
        # committed, which the check below must see (else the parked run would be queued and
        # resume after its wait, undecided).
        Run.objects.select_for_update().filter(id=run_id).first()
        if Approval.objects.filter(run_id=run_id, status=Approval.Status.PENDING).exists() or \
                EventGate.objects.filter(run_id=run_id, status=EventGate.Status.OPEN).exists():
            raise RunError("run_waiting_on_something", "the run waits for an approval or an "
                           "event: decide it, send the event, or cancel the run")
        if _branches_requeue(run_id, by=by):
            return Run.objects.get(id=run_id)
        updated = Run.objects.filter(
            id=run_id, status__in=[Run.Status.QUEUED, Run.Status.RUNNING, Run.Status.WAITING]
        ).update(status=Run.Status.QUEUED, lease_owner="", lease_expires_at=None,
                 lease_epoch=F("lease_epoch") + 1, waiting_reason="", updated_at=timezone.now(),
                 claims_without_checkpoint=0)  # a person looked: the poison count starts over
        if not updated:
            raise RunError("run_finished", "only queued, running or waiting runs can be re-queued")
        event_record(run_id=run_id, kind="operator_requeued", by=by)
        run_enqueue(run_id)
    return Run.objects.get(id=run_id)


def _branches_requeue(run_id: UUID, *, by: str) -> bool:
    """A run waiting at a fan-out join is re-queued by putting its unfinished branches back in
    line; the run keeps waiting. (Re-queueing the run itself would run the join at once, its
    branches unrun and counted as failed.) False when the run is not waiting for branches."""
    run = Run.objects.select_for_update().filter(id=run_id, status=Run.Status.WAITING).first()
    parked = run.checkpoints.order_by("-visit").first() if run else None
    if parked is None or (parked.waiting or {}).get("kind", "fan_out") != "fan_out":
        return False
    pending = list(Branch.objects.filter(run=run, visit=parked.visit, status=Branch.Status.PENDING)
                   .values_list("index", flat=True))
    if not pending and not Branch.objects.filter(run=run, visit=parked.visit,
                                                 status=Branch.Status.RUNNING).exists():
        return False
    for index in pending:  # a running branch keeps its lease: the watchdog retries it
        ready_mark(run_id=run.id, branch=index)
    if run.waiting_reason.startswith("fan_out: branch"):  # a branch was refused
        Run.objects.filter(id=run.id).update(
            waiting_reason=f"fan_out: {len(pending)} branches", updated_at=timezone.now())
    event_record(run_id=run.id, kind="operator_requeued", by=by, branches=pending)
    dispatch_after_commit()
    return True


def run_migrate(*, run_id: UUID, version: int, by: str) -> Run:
    """Re-pin a waiting or failed run to a newer version of its agent, if the step it resumes
    at (its latest checkpoint's) exists there. A run waiting on an approval, event, timer,
    child or branches keeps waiting, now on the new code; any other (a failed run, or one
    parked because its code was refused or its step was poison) goes back in line."""

    with transaction.atomic():
        run = Run.objects.select_for_update().filter(id=run_id).first()
        if run is None:
            raise RunError("not_found", "no such run")
        if run.status not in (Run.Status.WAITING, Run.Status.FAILED):
            raise RunError("run_not_migratable",
                           f"only waiting or failed runs can be migrated; this one is {run.status}")
        if version <= run.agent_version:
            raise RunError("version_not_newer", f"the run is on version {run.agent_version}; "
                           f"migrate it to a newer one, not {version}")
        try:
            agent = registry.get(run.agent, version)
        except UnknownAgent as exc:
            raise RunError("unknown_agent", str(exc)) from None
        checkpoint = run.checkpoints.order_by("-visit").first()
        if checkpoint is None or checkpoint.step is None:
            raise RunError("checkpoint_ended", "the run's last checkpoint is its end; there is "
                           "nothing to resume")
        if checkpoint.step not in agent.steps:
            raise RunError("step_missing", f"the run resumes at step {checkpoint.step!r}, "
                           f"which {agent.name} v{agent.version} does not have")
        pending_branches = list(Branch.objects.filter(
            run=run, visit=checkpoint.visit, status=Branch.Status.PENDING)
            .values_list("index", flat=True))
        parked_on_something = run.status == Run.Status.WAITING and (
            Approval.objects.filter(run=run, status=Approval.Status.PENDING).exists()
            or EventGate.objects.filter(run=run, status=EventGate.Status.OPEN).exists()
            or Wakeup.objects.filter(run_id=run.id, visit=checkpoint.visit).exists()
            or Branch.objects.filter(run=run, visit=checkpoint.visit,
                                     status=Branch.Status.RUNNING).exists()
            or bool(pending_branches))
        fields = {"agent_version": agent.version, "topology_hash": agent.topology_hash,
                  "claims_without_checkpoint": 0, "updated_at": timezone.now()}
        if not parked_on_something:  # failed, or parked as refused: back in line
            fields.update(status=Run.Status.QUEUED, waiting_reason="", error="",
                          finished_at=None, lease_owner="", lease_expires_at=None,
                          lease_epoch=F("lease_epoch") + 1)
        elif run.waiting_reason.startswith("fan_out: branch"):  # a branch was refused
            fields.update(waiting_reason=f"fan_out: {len(pending_branches)} branches")
        Run.objects.filter(id=run.id).update(**fields)
        event_record(run_id=run.id, kind="run_migrated", visit=checkpoint.visit, by=by,
                     from_version=run.agent_version, to_version=agent.version,
                     requeued=not parked_on_something)
        if not parked_on_something:
            run_enqueue(run.id)
        for index in pending_branches:  # refused branches wait out of line: put them back
            ready_mark(run_id=run.id, branch=index)
        if pending_branches:
            dispatch_after_commit()
    return Run.objects.get(id=run_id)


def run_resume(*, run_id: UUID, visit: int, step: str | None, update: dict, event: str,
               held: Run | None = None, **event_data) -> bool:
    """Wake a parked run: in the caller's transaction, write the checkpoint it resumes from
    (the chosen next step, and what it waited for merged into its state), put it in line and
    hand it out (`run_enqueue`: the caller does little after this).

    Returns False if the run is not parked at `visit` any more (a stale wake-up). What it
    waited for, too large for its state, is state_too_large (nothing is written). `held`: the
    run's row as the caller locked it (FOR UPDATE) in this transaction, not read again."""
    assert held is None or held.id == run_id, "held must be the row of the run resumed"
    run = held if held is not None else Run.objects.select_for_update().filter(id=run_id).first()
    parked = Checkpoint.objects.filter(run_id=run_id).order_by("-visit").first()
    if run is None or run.status != Run.Status.WAITING or parked is None or parked.visit != visit:
        return False
    if step is not None or update:  # marked as a wake-up's: a fork here waits again instead
        try:
            state = state_merge(parked.state, update)
        except StateTooLarge as exc:  # a decision's artifact or an event's payload: refused
            raise RunError("state_too_large", f"The run cannot take this in: {exc}.") from None
        Checkpoint.objects.create(
            run=run, visit=visit + 1, step=step or parked.step,
            state=state, log_offsets=parked.log_offsets,
            agent_version=parked.agent_version, topology_hash=parked.topology_hash,
            waiting={"woken_from": visit},
        )
    Run.objects.filter(id=run_id).update(status=Run.Status.QUEUED, waiting_reason="",
                                         updated_at=timezone.now())
    run.status = Run.Status.QUEUED  # a caller's `held` row too: it cannot resume it again
    inbox().wakeup_cancel(run_id=run_id)
    event_record(run_id=run_id, kind=event, visit=visit, **event_data)
    run_enqueue(run_id)  # the only hop to a worker: see there
    return True


def run_fail_parked(*, run_id: UUID, reason: str) -> None:
    failed = Run.objects.filter(id=run_id, status=Run.Status.WAITING).update(
        status=Run.Status.FAILED, error=reason, waiting_reason="", finished_at=timezone.now())
    if failed:
        event_record(run_id=run_id, kind="run_failed", error=reason)
        run_finished_count(status=Run.Status.FAILED)
        child_report(run_id=run_id, status=Run.Status.FAILED, error=reason)


def child_report(*, run_id: UUID, status: str, result=None, error: str = "") -> None:
    """A child run ended: wake the parent if it is still parked on this child, at the visit it
    started it (in the caller's transaction, which holds the child's row: child, then parent).
    A late report for a parent that moved on, or was cancelled, wakes nothing."""
    parent_id = Run.objects.filter(id=run_id).values_list("parent_id", flat=True).first()
    parent = Run.objects.select_for_update().filter(id=parent_id).first() if parent_id else None
    if parent is None or parent.status != Run.Status.WAITING:
        return
    parked = Checkpoint.objects.filter(run_id=parent.id).order_by("-visit").first()
    waits_here = EventGate.objects.filter(run_id=parent.id, visit=parked.visit, kind="child_run",
                                          key=str(run_id), status=EventGate.Status.OPEN).exists()
    if not waits_here or (parked.waiting or {}).get("kind", "child_run") != "child_run":
        return
    inbox().event_deliver(kind="child_run", key=str(run_id), source_id=f"child:{run_id}",
                  payload={"run": str(run_id), "status": status, "result": result,
                           "error": error})
