"""Sandbox start latency: `true` and a small Python script, N times each, in the real jail.

    python -m bench sandbox [--runs 200]

Ends with `sandbox: start_p50_ms=<…> start_p99_ms=<…>` (for `true`; the goal is p50 ≤ 25 ms).
Measured around `sandbox_execute()`: workspace listing, bwrap, namespaces, prlimit, exec, exit,
output collection. No database: the recorded-call row adds one INSERT per call.
"""

import argparse
import os
import shutil
import statistics
import time
import uuid


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench sandbox")
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentplatform.settings")
    os.environ.setdefault("DJANGO_DEBUG", "1")
    import django

    django.setup()
    from sandboxes.jail import Limits, sandbox_execute, sandbox_probe
    from sandboxes.services import LocalWorkspace

    sandbox_probe()
    local = LocalWorkspace(schema="bench", run_id=uuid.uuid4())
    local.reset()
    limits = Limits.from_settings(timeout=30)
    cases = {"true": ["true"],
             "python": ["python3", "-c", "import json; print(json.dumps(sum(range(1000))))"]}
    timings: dict[str, list[float]] = {}
    try:
        for label, command in cases.items():
            sandbox_execute(workspace=local.path, command=command, limits=limits)  # warm caches
            timings[label] = []
            for _ in range(args.runs):
                started = time.perf_counter()
                result = sandbox_execute(workspace=local.path, command=command, limits=limits)
                timings[label].append((time.perf_counter() - started) * 1000)
                if result.exit_code != 0:
                    print(f"{label}: exit {result.exit_code}: {result.stderr[-500:]}")
                    return 1
            values = timings[label]
            print(f"{label:>7}: n={len(values)} p50_ms={percentile(values, 50):.1f} "
                  f"p90_ms={percentile(values, 90):.1f} p99_ms={percentile(values, 99):.1f} "
                  f"mean_ms={statistics.fmean(values):.1f}")
    finally:
        shutil.rmtree(local.dir, ignore_errors=True)
    values = timings["true"]
    print(f"sandbox: start_p50_ms={percentile(values, 50):.1f} "
          f"start_p99_ms={percentile(values, 99):.1f}")
    return 0
