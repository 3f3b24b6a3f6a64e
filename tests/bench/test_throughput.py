"""The throughput benchmark runs end to end at tiny sizes: workers, beat, the API, the closing
line (ours only: the DBOS peer is the same code path with another system)."""

import os
import re
import subprocess
import sys
from pathlib import Path

from bench.throughput import Measured, median_round

ROOT = Path(__file__).resolve().parents[2]


def test_throughput_bench_posts_runs_through_the_api_and_prints_its_closing_line():
    slot = os.environ.get("TEST_SLOT", "0")
    env = {**os.environ, "BENCH_SLOT": slot,
           "BENCH_DATABASE_URL": f"postgres://postgres@127.0.0.1:5432/agentplatform_bench_tp_test{slot}",
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "platform")])}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    done = subprocess.run(
        [sys.executable, "-m", "bench", "throughput", "--tenants", "2", "--runs", "2",
         "--steps", "3", "--workers", "1", "--concurrency", "1", "--settle", "0",
         "--systems", "ours", "--deadline", "40", "--rounds", "1"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert len([line for line in lines if line.startswith("ours: ")]) == 1, lines
    assert re.fullmatch(
        r"throughput: tenants=2 runs=4 steps_per_s=\d+ vs_dbos=n/a cpu_ms_per_step=\d+\.\d\d "
        r"pg_tx_per_step=\d+\.\d\d p99_run_s=\d+\.\d\d tenant_spread=\d+\.\d\d", lines[-1]), lines


def _pass(system: str, seconds: float) -> Measured:
    return Measured(system=system, tenants=1, runs=1, steps=1000, seconds=seconds,
                    post_seconds=0.0, run_seconds={"t": [seconds]}, cpu_seconds=0.0,
                    transactions=0)


def test_the_reported_round_is_that_of_the_median_ratio_and_of_two_middle_ones_the_lower():
    # (ours steps/s, DBOS steps/s): ratios 2, 5, 3 -> the median round is the third
    rounds = [(_pass("ours", 1 / 2), _pass("dbos", 1)), (_pass("ours", 1 / 5), _pass("dbos", 1)),
              (_pass("ours", 1 / 6), _pass("dbos", 1 / 2))]
    ours, dbos = median_round(rounds)
    assert round(ours.steps_per_s / dbos.steps_per_s, 6) == 3
    ours, dbos = median_round(rounds[:2])  # ratios 2 and 5: the lower
    assert round(ours.steps_per_s / dbos.steps_per_s, 6) == 2
    ours, dbos = median_round([(_pass("ours", 1), None), (_pass("ours", 1 / 3), None),
                               (_pass("ours", 1 / 2), None)])  # without DBOS: by our speed
    assert dbos is None and round(ours.steps_per_s) == 2000
