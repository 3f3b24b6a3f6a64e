"""Driving runs in the test process, without Celery: the engine is free of it, so a test can
start a run and advance it to its end itself."""

from runs import engine
from runs.models import Run, RunEvent
from runs.services import run_start


def start(agent: str, **kwargs) -> Run:
    """A run that no worker will pick up (nothing is put in line)."""
    return run_start(agent=agent, enqueue=False, **kwargs).run


def finished(run_id, **kwargs) -> Run:
    """Advance the run in this process, slice after slice, until it parks or ends."""
    outcome = engine.advance(run_id=run_id, sleep=lambda s: None, **kwargs)
    while outcome == engine.Outcome.SLICE_USED:
        outcome = engine.advance(run_id=run_id, sleep=lambda s: None, **kwargs)
    return Run.objects.get(id=run_id)


def kinds(run: Run) -> list[str]:
    """The kinds of the run's events, in order."""
    return list(RunEvent.objects.filter(run=run).order_by("id").values_list("kind", flat=True))
