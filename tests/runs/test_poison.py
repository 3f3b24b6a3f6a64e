"""Poison steps under a real worker: a step that kills its worker every time is claimed at most
RUN_MAX_CLAIMS_WITHOUT_CHECKPOINT times, then its run is parked for a person."""

from django.conf import settings

from runs.models import Run, RunEvent
from runs.services import run_cancel, run_requeue, run_start
from tests.support.waiting import wait_for


def test_a_step_that_kills_its_worker_parks_the_run_after_n_claims(in_acme, worker):
    run = run_start(agent="poison").run
    parked = wait_for(lambda: Run.objects.filter(id=run.id, status="waiting").first(),
                      timeout=120, interval=0.2, what="the poison run to be parked")
    assert "poison step" in parked.waiting_reason and "'crash'" in parked.waiting_reason
    # N claims that died in the step, and the one that parked it
    assert parked.lease_epoch == settings.RUN_MAX_CLAIMS_WITHOUT_CHECKPOINT + 1
    assert RunEvent.objects.filter(run=run, kind="poison_step").count() == 1
    assert worker.process.poll() is None  # the pool replaced its children; the worker lives

    run_requeue(run_id=run.id, by="operator")  # an operator gives it another chance
    assert Run.objects.get(id=run.id).claims_without_checkpoint == 0
    run_cancel(run_id=run.id)
    wait_for(lambda: Run.objects.filter(id=run.id, status__in=Run.FINISHED).exists()
             or Run.objects.filter(id=run.id, status="waiting").exists(),
             timeout=120, interval=0.2, what="the re-queued poison run to stop again")
