"""Driving runs in the test process, without Celery: the engine is free of it, so a test can
start a run and advance it to its end itself."""

import time

from runs import engine
from runs.models import Run, RunEvent
from runs.services import run_start


def start(agent: str, **kwargs) -> Run:
    """A run that no worker will pick up (nothing is put in line)."""
    return run_start(agent=agent, enqueue=False, **kwargs).run


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


def kinds(run: Run) -> list[str]:
    """The kinds of the run's events, in order."""
    return list(RunEvent.objects.filter(run=run).order_by("id").values_list("kind", flat=True))
