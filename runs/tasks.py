"""Celery tasks: load ids, call the engine. The tenant comes from the task's schema header."""

import logging
import time
from functools import partial
from uuid import UUID

from celery import shared_task
from celery.signals import worker_process_init
from django.conf import settings
from django.db import DatabaseError, connection, transaction

from agentplatform.doorbell import Ring, doorbell_ring_all, doorbell_waiting
from agentplatform.drain import DrainableSlice, draining
from agentplatform.telemetry import trace_attached
from runs.dispatch.services import dispatch_ready
from tenants.selection import tenant_schema

from . import engine
from .leases import leases
from .models import Run

log = logging.getLogger(__name__)


@worker_process_init.connect
def heartbeat_start(**_) -> None:
    """Each pool process of a run worker beats from its start (WorkerHeartbeat): the console
    lists it alive while it is idle too."""
    leases.start()


@shared_task(name="runs.advance", bind=True)
def advance(task, run_id: str) -> str:
    """Run a slice of the run; then hand the freed slot to whoever is next in fair order, in
    the transaction in which the run leaves (ends, parks, goes back in line), or after it if
    that could not be done there. A draining worker (SIGTERM) ends the slice after the step
    in progress.

    The slot goes on in this task (docs/decisions/0026): if the pick that refills it picks a
    run, this worker runs that one next itself, in its tenant, with no message through the
    broker, as long as no message waits there for a worker (those were handed out first),
    and until RUN_SLICE_SECONDS have passed (each run then has its own slice) or the worker
    drains; then the pick is rung like any other. A pick this task could not run is rung."""
    tenant_schema()
    chain_ends = time.monotonic() + settings.RUN_SLICE_SECONDS
    kept: list[Ring] = []
    try:
        outcome = _advance_one(run_id, kept, left=[])
        while kept and _chain_goes_on(chain_ends):
            ring, left = kept.pop(), []
            try:
                connection.set_tenant(task.get_tenant_for_schema(ring.schema))
                with trace_attached(ring.traceparent):
                    _advance_one(ring.args[0], kept, left=left)
            except Exception:
                log.exception("run %s (taken after run %s) failed in the worker", ring.args[0],
                              run_id)
                if not left:  # it never left this worker (never claimed, or it holds the
                    kept.append(ring)  # lease until it lapses): its message, rung below
                break  # (one that left is in line or ended: the dispatcher has it)
    finally:
        _rung_now(kept)
    return outcome.value


def _rung_now(rings: list[Ring]) -> None:
    """Ring what this task kept and did not run, outside a transaction: sent now. If even
    that fails (the database is away), their ready rows stay dispatched: the watchdog hands
    them out again, as it does a lost message."""
    try:
        doorbell_ring_all(rings, robust=True)
    except Exception:
        log.exception("runs %s: not rung; the watchdog hands them out",
                      [ring.args[0] for ring in rings])


def _chain_goes_on(chain_ends: float) -> bool:
    """Whether this task runs the pick it kept itself rather than ring it."""
    if draining.is_set() or time.monotonic() >= chain_ends:
        return False
    return not doorbell_waiting("runs.advance")  # None (broker away): it needs no broker


def _advance_one(run_id: str, kept: list[Ring], *, left: list[str]) -> engine.Outcome:
    """`engine.advance` of the run in the connection's tenant, then its slot handed out; the
    pick kept for this worker, if any, is appended to `kept` once its transaction commits, and
    the run's id to `left` once the transaction in which it left this worker commits. A run
    this worker did not run (another holds it, its code is not deployed here, the lease was
    lost) keeps nothing: its slot goes through the broker, to a worker that may."""
    handed_out = []

    def slot_hand_out() -> None:
        # Last in the run's last transaction here, waiting for the dispatcher's lock (up to
        # DISPATCH_LOCK_WAIT_SECONDS). In a savepoint: an error there (the victim of a rare
        # deadlock, see docs/decisions/0025) leaves the end whole, and the slot is handed out
        # after it; an error that broke the transaction itself (the connection) is raised.
        transaction.on_commit(partial(left.append, run_id))
        try:
            handed_out.append(dispatch_ready(robust=True, wait=True, keep=kept) is not None)
        except DatabaseError:
            if connection.needs_rollback:
                raise
            log.warning("run %s: its slot is handed out after its end instead", run_id,
                        exc_info=True)

    outcome = engine.advance(run_id=UUID(run_id), on_leave=slot_hand_out,
                             slice_seconds=DrainableSlice(settings.RUN_SLICE_SECONDS))
    if draining.is_set():
        log.info("draining: run %s given back after its current step (%s)", run_id, outcome.value)
    if outcome != engine.Outcome.NOT_CLAIMED and not any(handed_out):
        ran = outcome not in (engine.Outcome.DEFERRED, engine.Outcome.LEASE_LOST)
        dispatch_ready(robust=True, keep=kept if ran else None)
    return outcome


@shared_task(name="runs.advance_branch")
def advance_branch(run_id: str, index: int) -> str:
    tenant_schema()
    try:
        outcome = engine.branch_advance(run_id=UUID(run_id), index=index)
    except engine.LeaseLost as exc:
        log.warning("stopping: %s", exc)
        outcome = engine.Outcome.LEASE_LOST
    if outcome != engine.Outcome.NOT_CLAIMED:
        dispatch_ready()
    return outcome.value


@shared_task(name="runs.run_status", ignore_result=False)
def run_status(run_id: str) -> dict:
    """The status of a run in the task's tenant, or not_found: used by operators' probes."""
    schema = tenant_schema()
    run = Run.objects.filter(id=UUID(run_id)).values("status", "steps_taken").first()
    return {"schema": schema, "found": run is not None, **(run or {})}
