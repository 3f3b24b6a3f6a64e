"""Fan-out branches: each runs its step once under a lease of its own; its result is its row,
and the last branch to finish puts the run back in line for its join step."""

import time
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from agentplatform.storable import json_storable
from runs.dispatch.services import ready_clear, ready_defer, ready_mark

from ..events import event_record
from ..leases import leases
from ..models import Branch, Checkpoint, Run
from ..transitions import Fail, Finish
from .claims import agent_for, poison_reason
from .harness import Harness, error_kept, transition_refused
from .outcome import Outcome, StepError, worker_id
from .ports import BudgetExceeded, NeedsPerson
from .store import branch_claim, branch_fence, checkpoint_at
from .writer import Position


def branch_release(branch: Branch, *, reason: str, retry_seconds: float | None) -> Outcome:
    """Give the branch back, pending and uncounted: in line again after `retry_seconds` for a
    worker that has its agent's code, or (None) out of line until the run is migrated."""
    with transaction.atomic():
        branch_fence(branch, status=Branch.Status.PENDING, lease_owner="", lease_expires_at=None,
                     attempts=F("attempts") - 1)
        if retry_seconds is not None:
            deferred_for = ready_defer(run_id=branch.run_id, branch=branch.index,
                                       delay_seconds=retry_seconds)
            if deferred_for <= settings.RUN_UNKNOWN_AGENT_GRACE_SECONDS:
                return Outcome.DEFERRED
        ready_clear(run_id=branch.run_id, branch=branch.index)
        Run.objects.filter(id=branch.run_id, status=Run.Status.WAITING).update(
            waiting_reason=f"fan_out: branch {branch.index} refused: {reason}")
        event_record(run_id=branch.run_id, kind="resume_refused", visit=branch.visit,
                     branch=branch.index, reason=reason)
    return Outcome.PARKED


def branch_advance(*, run_id: UUID, index: int, owner: str | None = None,
                   sleep=time.sleep) -> Outcome:
    """Run one fan-out branch; its result is a pending write. The last branch to finish puts
    the run back in line for its join step, in the same transaction."""
    owner = owner or worker_id()
    branch = branch_claim(run_id=run_id, index=index, owner=owner)
    if branch is None:
        return Outcome.NOT_CLAIMED
    run = Run.objects.get(id=run_id)
    if run.status != Run.Status.WAITING:
        return _branch_finish(branch, ok=False, error=f"run is {run.status}")
    if branch.attempts > settings.RUN_MAX_CLAIMS_WITHOUT_CHECKPOINT:  # a branch cannot park
        event_record(run_id=run.id, kind="poison_step", visit=branch.visit, branch=index)
        return _branch_finish(branch, ok=False, error=poison_reason(
            claims=branch.attempts - 1, step=branch.step, where=f"branch {index}"))
    agent, refusal, unknown_here = agent_for(run)
    if refusal:  # refused branches stay pending: for a worker that has the code, or a migrate
        return branch_release(branch, reason=refusal, retry_seconds=(
            settings.RUN_UNKNOWN_AGENT_RETRY_SECONDS if unknown_here else None))
    lease = {"schema": connection.schema_name, "table": Branch._meta.db_table,
             "row_id": branch.id}
    leases.hold(epoch=branch.lease_epoch, **lease)
    try:
        step = agent.steps[branch.step]
        checkpoint = checkpoint_at(run=run, visit=branch.visit)
        position = Position(visit=branch.visit, step=branch.step, state=checkpoint.state,
                            offsets=dict(checkpoint.log_offsets), handed_over=True)
        harness = Harness(run, agent, epoch=-1, owner=owner, slice_seconds=0, sleep=sleep)
        try:
            transition = harness.branch_step(branch, step, position)
        except (StepError, NeedsPerson, BudgetExceeded) as exc:  # a branch cannot park
            return _branch_finish(branch, ok=False, error=f"{type(exc).__name__}: {exc}")
        if harness.notifications:
            return _branch_finish(branch, ok=False, error=(
                f"branch step {step.name!r} used ctx.notify; branches have no checkpoint to "
                "commit it with: use ctx.effect, or notify from the join step"))
        refused = transition is not None and transition_refused(step, transition, [])
        if refused:  # its result is a row: refused now, in words
            return _branch_finish(branch, ok=False, error=refused)
        match transition:
            case Finish(result=result, update=update, append=append) if not update and not append:
                return _branch_finish(branch, ok=True, value=result)
            case Fail(reason=reason):
                return _branch_finish(branch, ok=False, error=reason)
            case None:
                return _branch_finish(branch, ok=False, error=harness.last_error)
        return _branch_finish(branch, ok=False, error=(
            f"branch step {step.name!r} must return finish(value) or fail(reason), "
            f"not {type(transition).__name__} with state changes"))
    finally:
        leases.release(**lease)


def _branch_finish(branch: Branch, *, ok: bool, value: Any = None, error: str = "") -> Outcome:
    with transaction.atomic():
        Run.objects.select_for_update().filter(id=branch.run_id).first()  # serialise the last two
        branch_fence(branch, status=Branch.Status.DONE if ok else Branch.Status.FAILED,
                     result=value, error=json_storable(error_kept(error)), lease_owner="",
                     lease_expires_at=None, finished_at=timezone.now())
        ready_clear(run_id=branch.run_id, branch=branch.index)
        open_branches = Branch.objects.filter(
            run_id=branch.run_id, visit=branch.visit,
            status__in=[Branch.Status.PENDING, Branch.Status.RUNNING]).exists()
        # A late report wakes no other wait: the run must still be parked at this join.
        parked = Checkpoint.objects.filter(run_id=branch.run_id).order_by("-visit").first()
        still_joining = parked is not None and parked.visit == branch.visit and \
            (parked.waiting or {}).get("kind", "fan_out") == "fan_out"
        if not open_branches and still_joining:
            resumed = Run.objects.filter(id=branch.run_id, status=Run.Status.WAITING).update(
                status=Run.Status.QUEUED, waiting_reason="", updated_at=timezone.now())
            if resumed:
                event_record(run_id=branch.run_id, kind="fan_in", visit=branch.visit)
                ready_mark(run_id=branch.run_id)
    return Outcome.ENDED
