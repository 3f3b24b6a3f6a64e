"""Shallow history: only the latest checkpoint is kept, for finished and running runs alike."""

from datetime import timedelta

from django.db import connection
from django_tenants.utils import tenant_context

from runs.models import Checkpoint, LogEntry, Run, RunEvent
from runs.retention import services
from runs.services import run_start
from tests.retention.conftest import run_finished
from tests.support.waiting import wait_for


def test_a_finished_shallow_run_keeps_only_its_final_checkpoint(archive_pass):
    shallow = run_finished(agent="tidy", steps=6, age=timedelta(hours=1))  # within its 1-day TTL
    overridden = run_finished(steps=6, age=timedelta(hours=1))
    services.run_retention_set(run_id=overridden.id, history="shallow")
    full = run_finished(steps=6, age=timedelta(hours=1))

    archive_pass()

    for run in (shallow, overridden):
        assert list(Checkpoint.objects.filter(run=run).values_list("visit", "step")) == [(7, None)]
        assert LogEntry.objects.filter(run=run).count() == 6  # what resuming and audit need
        assert RunEvent.objects.filter(run=run).count() == 2
        assert Run.objects.filter(id=run.id).exists()  # not due yet: still hot
    assert Checkpoint.objects.filter(run=full).count() == 8


def test_a_shallow_run_of_500_steps_stays_resumable_and_its_checkpoints_stay_flat(in_acme, worker):
    run = run_start(agent="tidy", input={"steps": 500, "pause": 0.004}).run  # 2 s at least
    seen = []

    def compacted_and_done():
        with tenant_context(in_acme):
            services.shallow_compact()
            seen.append(Checkpoint.objects.filter(run_id=run.id).count())
            return Run.objects.get(id=run.id).status in Run.FINISHED

    wait_for(compacted_and_done, timeout=120, interval=0.05, what="the shallow run to finish")
    connection.set_tenant(in_acme)
    finished = Run.objects.get(id=run.id)
    assert finished.status == "succeeded", finished.error
    assert finished.result == {"said": 500, "messages": 500}  # resumed across slices intact
    services.shallow_compact()
    assert Checkpoint.objects.filter(run_id=run.id).count() == 1
    assert len(seen) > 5 and max(seen) < 250, seen  # bounded while it ran, not 500 (a pass
    # every 50 ms or so: 40 while the run's steps take 2 s; 5 on a machine fast enough, without
    # the pause, to run 500 steps in a quarter of a second)
