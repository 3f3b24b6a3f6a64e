"""Driving runs in the test process, without Celery: the engine is free of it, so a test can
start a run and advance it to its end itself."""

import time
from contextlib import contextmanager

import psycopg
from django.conf import settings

from runs import engine
from runs.dispatch.services import DISPATCH_LOCK
from runs.models import Run, RunEvent
from runs.services import run_start


def start(agent: str, **kwargs) -> Run:
    """A run that no worker will pick up (nothing is put in line)."""
    return run_start(agent=agent, enqueue=False, **kwargs).run


def advanced(run_id, **kwargs) -> engine.Outcome:
    """One `engine.advance` with a slice no loaded machine uses up in a test's run (the tests'
    RUN_SLICE_SECONDS is 0.5 s): how it ended, parked or ended rather than `slice_used`."""
    return engine.advance(run_id=run_id, **{"slice_seconds": 600, **kwargs})


def finished(run_id, *, timeout: float = 30.0, **kwargs) -> Run:
    """Advance the run in this process, slice after slice, until it parks or ends. A worker this
    test session started may take the run first (a decision or an event rings its doorbell):
    then wait for that worker to park or end it."""
    deadline = time.monotonic() + timeout
    while True:
        outcome = engine.advance(run_id=run_id, sleep=lambda s: None, **kwargs)
        if outcome == engine.Outcome.SLICE_USED:
            continue
        run = Run.objects.get(id=run_id)
        busy = run.status in (Run.Status.QUEUED, Run.Status.RUNNING)
        if outcome != engine.Outcome.NOT_CLAIMED or not busy or time.monotonic() > deadline:
            return run
        time.sleep(0.05)


def other_connection() -> psycopg.Connection:
    """A connection of its own to the test database, outside Django's: to PostgreSQL itself,
    even when the tests go through a transaction pool (its session locks must stay put), and
    preparing nothing."""
    db = settings.DATABASE_DIRECT
    return psycopg.connect(host=db["HOST"] or "127.0.0.1", port=db["PORT"] or 5432,
                           dbname=db["NAME"], user=db["USER"] or None, autocommit=True,
                           prepare_threshold=None)


def waiting_on_a_lock(pid: int) -> bool:
    """Whether the backend `pid` waits for a lock now (asked on a connection of its own)."""
    with other_connection() as watcher:
        return watcher.execute("SELECT EXISTS (SELECT FROM pg_locks WHERE pid = %s "
                               "AND NOT granted)", [pid]).fetchone()[0]


@contextmanager
def dispatcher_held():
    """Nothing is handed out meanwhile: another connection holds the dispatcher's lock, so a
    tick or a session worker's hand-off skips (a wake-up's dispatch waits, then leaves it to
    the next tick). For a test that parks a fan-out and runs its branches itself: take them out
    of the ready list before letting go."""
    with other_connection() as holder:
        holder.execute("SELECT pg_advisory_lock(%s)", [DISPATCH_LOCK])
        yield


def kinds(run: Run) -> list[str]:
    """The kinds of the run's events, in order."""
    return list(RunEvent.objects.filter(run=run).order_by("id").values_list("kind", flat=True))
