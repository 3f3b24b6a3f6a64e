"""Celery tasks: load ids, call the engine. The tenant comes from the task's schema header."""

import logging
from uuid import UUID

from celery import shared_task
from celery.signals import worker_process_init
from django.conf import settings
from django.db import DatabaseError, connection

from agentplatform.drain import DrainableSlice, draining
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


@shared_task(name="runs.advance")
def advance(run_id: str) -> str:
    """Run a slice of the run; then hand the freed slot to whoever is next in fair order, in
    the transaction in which the run leaves (ends, parks, goes back in line), or after it if
    that could not be done there. A draining worker (SIGTERM) ends the slice after the step
    in progress."""
    tenant_schema()
    handed_out = []

    def slot_hand_out() -> None:
        # Last in the run's last transaction here, waiting for the dispatcher's lock (up to
        # DISPATCH_LOCK_WAIT_SECONDS). In a savepoint: an error there (the victim of a rare
        # deadlock, see docs/decisions/0025) leaves the end whole, and the slot is handed out
        # after it; an error that broke the transaction itself (the connection) is raised.
        try:
            handed_out.append(dispatch_ready(robust=True, wait=True) is not None)
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
        dispatch_ready()
    return outcome.value


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
