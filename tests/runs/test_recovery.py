"""Workers that fail safely: real worker processes killed, frozen, and cut off from Redis."""

import os
import signal
import subprocess

import pytest
import redis
from django.conf import settings
from django.db import connection
from django_tenants.utils import tenant_context

from runs.models import Branch, Checkpoint, Run, RunEvent
from runs.services import run_start
from tests.support.waiting import wait_for


def holder_pid(run_id) -> int:
    """The pid of the process holding the run's lease (owner is host:pid)."""
    owner = wait_for(lambda: Run.objects.filter(id=run_id, status="running")
                     .exclude(lease_owner="").values_list("lease_owner", flat=True).first(),
                     timeout=60, what="a worker to hold the run")  # a lease to expire, under load
    return int(owner.rsplit(":", 1)[1])


def worker_of(pid, workers):
    return next(w for w in workers if pid in w.pids())


def visits(run_id):
    return list(Checkpoint.objects.filter(run_id=run_id).order_by("visit")
                .values_list("visit", flat=True))


# A run stays with the worker that took it (a slice outlives the run), so the worker seen
# holding it is the one killed; the lease stays the tests' short one.
STAY = {"RUN_SLICE_SECONDS": "60"}


def test_killed_worker_run_resumes_on_another_worker(in_acme, beat, own_workers, start_worker):
    workers = [start_worker("a", 2, env=STAY), start_worker("b", 2, env=STAY)]
    run = run_start(agent="slowpoke", input={"seconds": 1.0, "count": 6}).run
    wait_for(lambda: Run.objects.get(id=run.id).steps_taken >= 1, what="a first step")
    doomed = worker_of(holder_pid(run.id), workers)
    pids, steps_before = doomed.pids(), Run.objects.get(id=run.id).steps_taken
    doomed.kill(signal.SIGKILL)  # mid-step: each step sleeps a second
    assert int(Run.objects.get(id=run.id).lease_owner.rsplit(":", 1)[1]) in pids

    done = wait_for(lambda: (r := Run.objects.get(id=run.id)).status == "succeeded" and r,
                    timeout=60, what="the run to finish on the surviving worker")
    assert done.result == 6 and done.steps_taken == 6
    assert visits(run.id) == list(range(7))  # the killed step's checkpoint committed once
    assert RunEvent.objects.filter(run=run, kind="lease_expired").exists()
    assert int(done.lease_epoch) >= 2 and steps_before < 6
    assert all(w.process.poll() is None for w in workers if w is not doomed)


def test_frozen_worker_is_fenced_off_when_it_wakes(in_acme, worker, start_worker):
    workers = [worker, start_worker("zombie"), start_worker("successor")]
    run = run_start(agent="slowpoke", input={"seconds": 1.5, "count": 3}).run
    pid = holder_pid(run.id)
    epoch_before = Run.objects.get(id=run.id).lease_epoch
    os.kill(pid, signal.SIGSTOP)  # heartbeat stops too: the lease expires
    try:
        done = wait_for(lambda: (r := Run.objects.get(id=run.id)).status == "succeeded" and r,
                        timeout=60, what="another worker to take over and finish")
        assert done.lease_epoch > epoch_before
        history = (visits(run.id), list(Checkpoint.objects.filter(run=run)
                                        .values_list("visit", "state")))
    finally:
        os.kill(pid, signal.SIGCONT)
    zombie = worker_of(pid, workers)
    wait_for(lambda: "was taken over" in zombie.log_tail(20000), timeout=30,
             what="the woken worker to notice it lost the lease")
    assert (visits(run.id), list(Checkpoint.objects.filter(run=run)
                                 .values_list("visit", "state"))) == history
    assert Run.objects.get(id=run.id).result == 3


def test_runs_complete_when_redis_loses_everything_mid_batch(in_acme, worker, start_worker):
    start_worker("extra")
    runs = [run_start(agent="slowpoke", input={"seconds": 0.2, "count": 5}).run
            for _ in range(8)]
    wait_for(lambda: Run.objects.filter(id__in=[r.id for r in runs], steps_taken__gte=1)
             .count() >= 2, what="the batch to start")
    redis.Redis.from_url(settings.CELERY_BROKER_URL).flushdb()  # a restart without persistence
    wait_for(lambda: Run.objects.filter(id__in=[r.id for r in runs], status="succeeded")
             .count() == 8, timeout=90, what="every run to finish after Redis lost its data")
    assert all(visits(r.id) == list(range(6)) for r in runs)


def pg_restart():
    version = sorted(os.listdir("/etc/postgresql"))[-1]
    subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "restart"],
                   check=True, capture_output=True, timeout=120)


@pytest.mark.exclusive
@pytest.mark.skipif(not os.path.isdir("/etc/postgresql"), reason="needs a local cluster")
def test_runs_complete_when_postgres_restarts_mid_batch(acme, worker, start_worker):
    start_worker("extra")
    with tenant_context(acme):
        runs = [run_start(agent="slowpoke", input={"seconds": 0.2, "count": 6}).run
                for _ in range(6)]
        ids = [r.id for r in runs]
        wait_for(lambda: Run.objects.filter(id__in=ids, steps_taken__gte=1).count() >= 2,
                 what="the batch to start")
    connection.close()
    pg_restart()

    def all_done():
        try:
            with tenant_context(acme):
                return Run.objects.filter(id__in=ids, status="succeeded").count() == 6
        except Exception:  # the server is still starting
            connection.close()
            return False

    wait_for(all_done, timeout=120, interval=0.5, what="every run to finish after the restart")
    with tenant_context(acme):
        assert all(visits(i) == list(range(7)) for i in ids)


def test_fan_out_survives_a_killed_worker_and_joins_once(in_acme, worker, start_worker):
    workers = [worker, start_worker("fan-a", 2), start_worker("fan-b", 2)]
    run = run_start(agent="fanner", input={"count": 20, "seconds": 0.4}).run
    wait_for(lambda: Branch.objects.filter(run=run, status="done").count() >= 4,
             timeout=60, what="some branches to finish")
    running = Branch.objects.filter(run=run, status="running").exclude(lease_owner="").first()
    victim = workers[1]
    if running is not None:
        victim = worker_of(int(running.lease_owner.rsplit(":", 1)[1]), workers)
    done_before = {b.index: b.attempts for b in Branch.objects.filter(run=run, status="done")}
    victim.kill(signal.SIGKILL)

    done = wait_for(lambda: (r := Run.objects.get(id=run.id)).status == "succeeded" and r,
                    timeout=90, what="the join to run after the kill")
    assert done.result == {"branches": 20, "total": sum(i * i for i in range(20))}
    branches = Branch.objects.filter(run=run)
    assert branches.count() == 20 and not branches.exclude(status="done").exists()
    for index, attempts in done_before.items():  # finished branches did not run again
        assert branches.get(index=index).attempts == attempts
    assert RunEvent.objects.filter(run=run, kind="fan_in").count() == 1
    joins = Checkpoint.objects.filter(run=run, step=None)
    assert joins.count() == 1  # the join step's checkpoint, committed once
