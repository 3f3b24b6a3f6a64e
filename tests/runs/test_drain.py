"""Draining a worker for a deploy: SIGTERM lets the step in progress finish and checkpoint, then
the run's lease is given back and the run is in line again at once (not after the lease TTL),
and the worker exits; another worker carries the run on from that checkpoint."""

import os
import signal
import time

import pytest

from runs.models import Checkpoint, Run, RunEvent
from runs.services import run_start
from tests.support.waiting import wait_for

# Long slices and leases in the drained workers: without the drain, the run would stay with
# the worker for its slice, and a killed worker's run would wait out the lease.
LONG = {"RUN_SLICE_SECONDS": "60", "RUN_LEASE_SECONDS": "30", "RUN_HEARTBEAT_SECONDS": "1"}
STEP_SECONDS = 1.5
COUNT = 4


def holder(run_id, workers):
    """The worker of `workers` whose process holds the run's lease, once one does."""
    def found():
        owner = Run.objects.filter(id=run_id, status="running").values_list(
            "lease_owner", flat=True).first()
        pid = int(owner.rsplit(":", 1)[1]) if owner else None
        return next((w for w in workers if pid in w.pids()), None)

    return wait_for(found, timeout=30, what="one of the test's workers to hold the run")


def checkpointed(run_id) -> list[int]:
    return list(Checkpoint.objects.filter(run_id=run_id).order_by("visit")
                .values_list("visit", flat=True))


@pytest.mark.parametrize("to", ["process group", "main process"])
def test_sigterm_finishes_the_step_gives_the_run_back_and_exits(in_acme, beat, own_workers,
                                                               start_worker, to):
    """`process group`: systemd's default (KillMode=control-group) and Ctrl-C in a terminal;
    `main process`: `docker stop`, `kill <pid>`: the worker passes it on to its pool."""
    workers = [start_worker("drained", 2, env=LONG), start_worker("successor", 2, env=LONG)]
    run = run_start(agent="slowpoke", input={"seconds": STEP_SECONDS, "count": COUNT}).run
    drained = holder(run.id, workers)
    # just after a step started: the drain must wait for it, and for nothing more
    steps = Run.objects.get(id=run.id).steps_taken
    wait_for(lambda: Run.objects.get(id=run.id).steps_taken > steps, timeout=10,
             interval=0.01, what="a step to end")
    time.sleep(0.2)
    in_step = Run.objects.get(id=run.id)
    assert in_step.lease_owner and in_step.steps_taken < COUNT
    signalled = time.monotonic()
    if to == "process group":
        os.killpg(drained.process.pid, signal.SIGTERM)
    else:
        os.kill(drained.process.pid, signal.SIGTERM)

    # the step in progress ends and is checkpointed by the drained worker, then it lets go
    def given_back():
        now = Run.objects.get(id=run.id)
        moved = (now.lease_owner, now.lease_epoch) != (in_step.lease_owner, in_step.lease_epoch)
        return now if moved else None

    released = wait_for(given_back, timeout=20, interval=0.02,
                        what="the drained worker to give the run back")
    assert time.monotonic() - signalled < STEP_SECONDS + 2  # not the slice (60 s), not the TTL
    assert released.steps_taken >= in_step.steps_taken + 1  # the step in progress counted
    assert drained.process.wait(timeout=15) == 0
    assert time.monotonic() - signalled < STEP_SECONDS + 10

    done = wait_for(lambda: (r := Run.objects.get(id=run.id)).status == "succeeded" and r,
                    timeout=60, what="the successor to finish the run")
    assert done.result == COUNT and done.steps_taken == COUNT
    assert checkpointed(run.id) == list(range(COUNT + 1))  # no step lost, none checkpointed twice
    assert not RunEvent.objects.filter(run=run, kind__in=["lease_expired", "step_error"]).exists()
    assert "Warm shutdown" in drained.log_tail(20000)
