"""`python -m bench recovery`: kill -9 workers mid-step and time how long until the run's next
step starts on another worker.

Real worker and beat processes on the bench database and a Redis db of its own. Each kill
takes a run that is mid-step, kills its worker's whole process group (a lost host), starts a
replacement worker (the fleet keeps its size), and measures from the kill to the moment a
different worker claims the run (its lease epoch moves on). Ends with one line:
`recovery: lease_ttl=<s> kills=<n> p50=<s> max=<s> lost_runs=<n> duplicate_steps_committed=<n>`
"""

import argparse
import os
import signal
import statistics
import time

from runs.agents import Agent
from runs.transitions import finish, goto

plodder = Agent("bench_plodder", version=1)


@plodder.step(start=True, next=["plod"])
def plod(ctx, state):
    time.sleep(state["seconds"])
    n = state.get("n", 0) + 1
    return finish(n) if n >= state["steps"] else goto("plod", update={"n": n})


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench recovery")
    parser.add_argument("--kills", type=int, default=6)
    parser.add_argument("--runs", type=int, default=6)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--step-seconds", type=float, default=0.5)
    parser.add_argument("--lease-ttl", type=float, default=2.0)
    parser.add_argument("--workers", type=int, default=3)
    args = parser.parse_args(argv)

    env = {"RUN_LEASE_SECONDS": str(args.lease_ttl),
           "RUN_HEARTBEAT_SECONDS": str(args.lease_ttl / 4),
           "DISPATCH_CHECK_AFTER_SECONDS": str(args.lease_ttl / 4),
           "DISPATCH_TICK_SECONDS": "0.25", "RUN_SLICE_SECONDS": "1",
           "AGENT_MODULES": "agents,bench.recovery"}
    os.environ.update(env)  # this process dispatches too
    from django.conf import settings

    settings.RUN_LEASE_SECONDS = args.lease_ttl
    from bench.platform import BenchPlatform
    from runs.models import Checkpoint, Run
    from runs.services import run_start

    with BenchPlatform(env=env, workers=args.workers) as platform, platform.tenant("bench"):
        runs = [run_start(agent="bench_plodder", input={"steps": args.steps,
                                                        "seconds": args.step_seconds}).run.id
                for _ in range(args.runs)]
        recoveries = []
        for kill in range(args.kills):
            victim_run = platform.wait_for(lambda: Run.objects.filter(
                id__in=runs, status="running").exclude(lease_owner="").order_by("?").first(),
                what="a run mid-step")
            owner, epoch = victim_run.lease_owner, victim_run.lease_epoch
            worker = platform.worker_of(int(owner.rsplit(":", 1)[1]))
            if worker is None:
                continue
            killed_at = time.monotonic()
            worker.kill(signal.SIGKILL)
            def taken_over(run_id=victim_run.id, epoch=epoch):
                run = Run.objects.get(id=run_id)  # only a claim moves the epoch on
                return run.is_finished or run.lease_epoch > epoch

            platform.wait_for(taken_over, timeout=60, interval=0.01,
                              what="another worker to take the run")
            recoveries.append(time.monotonic() - killed_at)
            print(f"kill {kill + 1}: run {victim_run.id} resumed after {recoveries[-1]:.2f}s")
            platform.replace(worker)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and Run.objects.filter(
                id__in=runs, status__in=["queued", "running"]).exists():
            time.sleep(0.2)
        lost = Run.objects.filter(id__in=runs).exclude(status="succeeded").count()
        duplicates = sum(
            Checkpoint.objects.filter(run_id=r).count()
            - Checkpoint.objects.filter(run_id=r).values("visit").distinct().count()
            for r in runs)
        wrong_counts = Run.objects.filter(id__in=runs, status="succeeded").exclude(
            steps_taken=args.steps).count()
    if not recoveries:
        print("no kill landed on a worker")
        return 1
    print(f"runs={args.runs} steps={args.steps} step_seconds={args.step_seconds} "
          f"wrong_step_counts={wrong_counts}")
    print(f"recovery: lease_ttl={args.lease_ttl:g} kills={len(recoveries)} "
          f"p50={statistics.median(recoveries):.2f} max={max(recoveries):.2f} "
          f"lost_runs={lost} duplicate_steps_committed={duplicates}")
    return 0 if lost == 0 and duplicates == 0 else 1


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
