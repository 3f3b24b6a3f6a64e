"""The partition benchmark: its counts on made-up writes and logs, and a small run end to end
(two hosts in network namespaces, one cut; needs root and `ip netns`, else skipped)."""

import os
import re
import subprocess
import sys
import uuid

import pytest

from agentplatform.localprocs import ROOT
from bench.partition import (
    duplicates_count,
    lost_runs_count,
    netns_available,
    refusals_count,
    zombie_writes,
)

HOSTS = {"partition-h1", "partition-h2"}


def write(tbl, writer, **fields):
    return {"tbl": tbl, "op": "INSERT", "run_id": uuid.uuid4(), "writer": writer,
            "run_owner": None, "run_epoch": None, "state_epoch": None, "claimed_by": None,
            "status": None, **fields}


def test_a_checkpoint_under_an_epoch_the_run_no_longer_has_is_a_zombie_write():
    fenced = write("checkpoint", "partition-h1", run_owner="partition-h1:10", run_epoch=2,
                   state_epoch=2)
    released = write("checkpoint", "partition-h1", run_owner="", run_epoch=2, state_epoch=2)
    zombie = write("checkpoint", "partition-h1", run_owner="partition-h2:20", run_epoch=3,
                   state_epoch=2)
    assert zombie_writes([fenced, released, zombie], HOSTS) == [zombie]


def test_an_effect_started_by_a_host_that_does_not_hold_the_lease_is_a_zombie_write():
    held = write("effect", "partition-h2", run_owner="partition-h2:20", run_epoch=3)
    zombie = write("effect", "partition-h1", op="UPDATE", run_owner="partition-h2:20",
                   run_epoch=3)
    unleased = write("effect", "partition-h1", run_owner="", run_epoch=3)
    started_here = write("effect", "", run_owner="", run_epoch=0)  # the bench, not a host
    assert zombie_writes([held, zombie, unleased, started_here], HOSTS) == [zombie, unleased]


def test_an_outbox_outcome_written_over_another_hosts_claim_is_a_zombie_write():
    own = write("outbox", "partition-h1", claimed_by="partition-h1:11 -> ")
    takeover = write("outbox", "partition-h2", claimed_by="partition-h1:11 -> partition-h2:21")
    zombie = write("outbox", "partition-h1", claimed_by="partition-h2:21 -> ")
    assert zombie_writes([own, takeover, zombie], HOSTS) == [zombie]


def test_refusals_are_counted_by_write_from_the_engines_log_lines(tmp_path):
    log = tmp_path / "h1.log"
    log.write_text(
        "[..: WARNING/ForkPoolWorker-1] fenced write refused (heartbeat): lease on x\n"
        "[..: WARNING/ForkPoolWorker-1] fenced write refused (checkpoint): run y\n"
        "[..: WARNING/ForkPoolWorker-1] stopping: run y: lease epoch 1 was taken over\n"
        "[..: WARNING/MainProcess] fenced write refused (outbox_record): outbox 3\n")
    counts = refusals_count([log, tmp_path / "missing.log"])
    assert counts == {"heartbeat": 1, "checkpoint": 1, "outbox_record": 1}


def test_a_second_key_for_one_message_is_a_duplicate_and_a_wrong_result_a_lost_run():
    assert duplicates_count({"r/work1/hook": {"k1"}, "r/work2/hook": {"k2", "k3"}}) == 1
    assert lost_runs_count(runs={1: ("succeeded", 3), 2: ("succeeded", 2), 3: ("running", None)},
                           steps=3) == 2


def test_a_cut_hosts_runs_are_taken_over_and_its_late_writes_refused():
    why = netns_available()
    if why:
        pytest.skip(f"partition bench {why}")
    slot = os.environ.get("TEST_SLOT", "0")
    env = {**os.environ, "BENCH_SLOT": slot}
    for name in ("BENCH_DATABASE_URL", "BENCH_REDIS_URL", "BENCH_QUEUE"):
        env.pop(name, None)
    done = subprocess.run(
        [sys.executable, "-m", "bench", "partition", "--hosts", "2", "--concurrency", "1",
         "--runs", "1", "--steps", "3", "--step-seconds", "2", "--lease-ttl", "2"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=150)
    last = done.stdout.strip().splitlines()[-2]  # then "(process logs in ...)"
    found = re.fullmatch(
        r"partition: hosts=2 cut=1 takeover_max_s=(\d+\.\d\d) lease_ttl=2 "
        r"zombie_writes_refused=(\d+) zombie_writes_accepted=0 duplicate_effects=0 lost_runs=0",
        last)
    assert found, done.stdout[-3000:] + done.stderr[-3000:]
    assert float(found[1]) <= 4 and int(found[2]) > 0, last
    assert done.returncode == 0
