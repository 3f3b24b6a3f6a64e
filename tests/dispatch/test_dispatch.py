"""Fair dispatch across tenants, per-tenant caps, and cancellation, with real workers."""

import threading
import time

from django.db import connection, transaction
from django_tenants.utils import tenant_context

from runs import services
from runs.dispatch.models import ReadyRun
from runs.models import Branch, Run
from runs.services import RunError, run_cancel, run_start
from tenants.models import Tenant
from tests.support.waiting import wait_for


def test_one_tenants_flood_does_not_starve_another_tenants_single_run(acme, globex, worker):
    with tenant_context(acme), transaction.atomic():  # in line at once, however slow this is
        flood = [run_start(agent="slowpoke", input={"seconds": 0.3, "count": 1}).run.id
                 for _ in range(40)]
    with tenant_context(globex):
        single = run_start(agent="slowpoke", input={"seconds": 0.3, "count": 1}).run.id
        wait_for(lambda: Run.objects.get(id=single).status == "succeeded", timeout=60,
                 what="globex's single run to finish")
    with tenant_context(acme):
        unfinished = Run.objects.filter(id__in=flood).exclude(status="succeeded").count()
        for run_id in flood:  # clean up; a worker may end one (cancelled) as we go
            try:
                run_cancel(run_id=run_id)
            except RunError as exc:
                assert exc.code == "run_finished"
    assert unfinished >= 30, f"globex waited for {40 - unfinished} of acme's 40 runs"


def test_a_tenant_never_has_more_runs_in_flight_than_its_cap(acme, worker, start_worker):
    start_worker("cap-extra", 2)
    Tenant.objects.filter(pk=acme.pk).update(max_in_flight=1)
    peak, stop = [0], threading.Event()

    def sample():
        while not stop.is_set():
            with tenant_context(acme):
                peak[0] = max(peak[0], Run.objects.filter(id__in=ids, status="running").count())
            time.sleep(0.02)
        connection.close()

    try:
        with tenant_context(acme):
            ids = [run_start(agent="slowpoke", input={"seconds": 0.2, "count": 2}).run.id
                   for _ in range(6)]
        sampler = threading.Thread(target=sample)
        sampler.start()
        with tenant_context(acme):
            wait_for(lambda: Run.objects.filter(id__in=ids, status="succeeded").count() == 6,
                     timeout=60, what="the capped runs to finish")
    finally:
        stop.set()
        Tenant.objects.filter(pk=acme.pk).update(max_in_flight=None)
    sampler.join()
    assert peak[0] == 1


def test_cancelling_a_run_waiting_on_its_fan_out_stops_its_branches(in_acme, worker):
    run = run_start(agent="fanner", input={"count": 30, "seconds": 0.5}).run
    wait_for(lambda: Run.objects.get(id=run.id).status == "waiting", what="the fan-out")
    cancelled = run_cancel(run_id=run.id)
    assert cancelled.status == "cancelled"
    wait_for(lambda: not Branch.objects.filter(run=run, status__in=["pending", "running"])
             .exists(), timeout=30, what="the branches to stop")
    assert Branch.objects.filter(run=run, status="failed").count() >= 20
    wait_for(lambda: not ReadyRun.objects.filter(run_id=run.id).exists(), timeout=10,
             what="the run to leave the ready list")
    assert Run.objects.get(id=run.id).status == "cancelled"


def test_a_start_whose_dispatch_fails_in_its_transaction_is_handed_out_after_it(in_acme, room,
                                                                                 monkeypatch):
    """run_start hands its run out in its own transaction; a database error there (a deadlock's
    victim) rolls back only the dispatch's savepoint: the run is created all the same and
    handed out once its transaction commits."""
    calls = []
    real = services.dispatch_ready

    def dispatch_ready(**options):
        calls.append(options)
        if len(calls) == 1:  # in run_start's transaction: fails inside a savepoint, as a
            with transaction.atomic(), connection.cursor() as cursor:  # dispatch would
                cursor.execute("SELECT 1 / 0")
        return real(**options)

    monkeypatch.setattr(services, "dispatch_ready", dispatch_ready)
    run = run_start(agent="slowpoke", input={"seconds": 0.01, "count": 1}).run
    assert calls == [{"robust": True, "wait": True}]
    assert Run.objects.filter(id=run.id).exists()
    # handed out after the commit (or already taken by a worker, which leaves its row so)
    assert not ReadyRun.objects.filter(run_id=run.id, dispatched_at=None).exists()
