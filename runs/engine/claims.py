"""A pass over one run (`advance`): claim its lease, then run its steps in the harness, or park,
defer or end it when it cannot run here (unknown code, poison step, cancel asked)."""

import logging
import time
from collections.abc import Callable
from uuid import UUID

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.utils import timezone
from opentelemetry import trace

from agentplatform.metrics import run_finished_count
from agentplatform.redaction import secrets_redact
from agentplatform.storable import json_storable
from agentplatform.telemetry import span_start
from runs.dispatch.services import ready_clear, ready_defer

from ..agents import Agent, UnknownAgent, registry
from ..events import event_record
from ..leases import leases
from ..models import Run
from .harness import Harness
from .outcome import CheckpointWriteFailed, ChildRunRefused, LeaseLost, Outcome, worker_id
from .ports import ports
from .store import checkpoint_latest, run_claim_read, run_fence, run_unclaim

log = logging.getLogger("runs.engine")
tracer = trace.get_tracer("agentplatform.runs")


def run_release_unknown(*, run: Run, epoch: int, reason: str) -> Outcome:
    """This worker does not have the run's agent version (a rolling deploy): give the claim back
    uncounted and put the run in line again after a delay, for a worker that has it. After
    RUN_UNKNOWN_AGENT_GRACE_SECONDS of that, park it for a person."""
    with transaction.atomic():
        deferred_for = ready_defer(run_id=run.id,
                                   delay_seconds=settings.RUN_UNKNOWN_AGENT_RETRY_SECONDS)
        if deferred_for <= settings.RUN_UNKNOWN_AGENT_GRACE_SECONDS:
            run_unclaim(run=run, epoch=epoch)
            event_record(run_id=run.id, kind="agent_unknown_here", reason=reason,
                         owner=worker_id(), deferred_seconds=round(deferred_for, 1))
            return Outcome.DEFERRED
    return run_park_refused(run=run, epoch=epoch, reason=(  # clears the deferred ready row
        f"{reason} (no worker ran it within {settings.RUN_UNKNOWN_AGENT_GRACE_SECONDS:g}s)"))


def run_park_refused(*, run: Run, epoch: int, reason: str,
                     kind: str = "resume_refused") -> Outcome:
    """Leave a run parked (waiting) with the reason it cannot run on this code (redacted: an
    engine error's message may quote a secret)."""
    reason = json_storable(secrets_redact(reason))  # a text column refuses U+0000
    with transaction.atomic():
        run_fence(run=run, epoch=epoch, status=Run.Status.WAITING, waiting_reason=reason,
                  lease_owner="", lease_expires_at=None)
        event_record(run_id=run.id, kind=kind, reason=reason)
        ready_clear(run_id=run.id)
    log.warning("run %s parked: %s", run.id, reason)
    return Outcome.PARKED


def run_end_cancelled(*, run: Run, epoch: int) -> Outcome:
    """End a claimed run whose cancel was asked for before its steps ran again."""
    with transaction.atomic():
        run_fence(run=run, epoch=epoch, status=Run.Status.CANCELLED, lease_owner="",
                  lease_expires_at=None, finished_at=timezone.now())
        event_record(run_id=run.id, kind="run_cancelled", steps_taken=run.steps_taken)
        run_finished_count(status=Run.Status.CANCELLED)
        ready_clear(run_id=run.id)
        if run.parent_id:
            ports().parking["child_report"](run_id=run.id, status=Run.Status.CANCELLED, result=None,
                         error="cancelled")
    return Outcome.ENDED


def poison_reason(*, claims: int, step: str | None, where: str) -> str:
    return (f"poison step: {where} was claimed {claims} times without reaching a checkpoint "
            f"(step {step!r} stops its worker: a crash, OOM or kill); fix the agent, then "
            "re-queue or migrate it")


def advance(*, run_id: UUID, owner: str | None = None, slice_seconds: float | None = None,
            sleep=time.sleep, on_leave: Callable[[], object] | None = None) -> Outcome:
    """Claim the run and run its steps until it parks, ends or uses its slice. `on_leave` is
    called last in the transaction in which its steps leave this worker (Harness._leave)."""
    owner = owner or worker_id()
    with transaction.atomic():  # the claim and the read of where it resumes: one transaction
        run = run_claim_read(run_id=run_id, owner=owner)  # returns the row: no re-read
        if run is None:
            return Outcome.NOT_CLAIMED
        # A statement of its own after the claim: it sees a checkpoint that a lease holder
        # committed while the claim waited for the row (one statement has one snapshot).
        latest = checkpoint_latest(run=run)
    epoch = run.lease_epoch
    if run.cancel_requested:  # cancel wins over parking it for a person or handing it back
        return run_end_cancelled(run=run, epoch=epoch)
    if run.claims_without_checkpoint > settings.RUN_MAX_CLAIMS_WITHOUT_CHECKPOINT:
        step = latest.step if latest is not None else None
        return run_park_refused(run=run, epoch=epoch, kind="poison_step", reason=poison_reason(
            claims=run.claims_without_checkpoint - 1, step=step, where="the run"))
    agent, refusal, unknown_here = agent_for(run)
    if unknown_here:
        return run_release_unknown(run=run, epoch=epoch, reason=refusal)
    if refusal:
        return run_park_refused(run=run, epoch=epoch, reason=refusal)
    harness = Harness(run, agent, epoch, owner,
                      slice_seconds if slice_seconds is not None else settings.RUN_SLICE_SECONDS,
                      sleep=sleep, latest=latest, on_leave=on_leave)
    lease = {"schema": connection.schema_name, "table": Run._meta.db_table, "row_id": run.id}
    leases.hold(epoch=epoch, **lease)
    try:
        with span_start(tracer, "run.advance", attributes={
                "tenant": connection.schema_name, "run.id": str(run.id), "agent": run.agent,
                "agent.version": run.agent_version, "lease.epoch": epoch,
                "durability": run.durability}) as span:
            outcome = harness.go()
            span.set_attribute("outcome", outcome.value)
            span.set_attribute("run.steps_taken", run.steps_taken)
            return outcome
    except LeaseLost as exc:
        log.warning("stopping: %s", exc)
        return Outcome.LEASE_LOST
    except (DatabaseError, CheckpointWriteFailed):
        raise  # the database is away: the lease expires and the watchdog retries the run
    except ChildRunRefused as exc:  # the agent's code asks for it: re-queueing asks again
        return run_park_refused(run=run, epoch=epoch, reason=(
            f"{exc}; fix the agent in a new version, then migrate the run"))
    except Exception as exc:  # a bug in the platform, not in a step: park, never loop
        # the traceback is all platform frames: operators read it in the log, tenants do not
        log.exception("engine error on run %s", run_id)
        event_record(run_id=run.id, kind="engine_error", error=f"{type(exc).__name__}: {exc}")
        return run_park_refused(run=run, epoch=epoch, reason=(
            f"engine error: {type(exc).__name__}: {exc}; fix and re-queue it from the console"))
    finally:
        leases.release(**lease)


def agent_for(run: Run) -> tuple[Agent | None, str, bool]:
    """The registered code the run is pinned to; or why it cannot run on this deploy, and
    whether only this worker lacks it (its version is not deployed here: another may have it)."""
    try:
        agent = registry.get(run.agent, run.agent_version)
    except UnknownAgent as exc:
        return None, f"{exc}; deploy it or migrate the run", True
    if agent.topology_hash != run.topology_hash:
        changed = (f"agent {agent.name!r} v{agent.version} changed its steps since this run "
                   f"started (topology {run.topology_hash[:12]} -> {agent.topology_hash[:12]})")
        if agent.kind == "tenant":  # its definition never changes: the platform's runner did,
            # and the old runner is not kept; a new version of the definition runs on this one
            return None, (f"{changed}: the platform's runner was upgraded; PUT the definition "
                          "again as a new version (change anything, e.g. its description), "
                          "then migrate the run to it"), False
        return None, (f"{changed}; register the new steps as a new version and keep this one "
                      "until its runs drain"), False
    return agent, "", False


