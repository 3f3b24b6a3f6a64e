"""`python -m bench fairness`: tenant A floods the platform with runs, then tenant B submits
one. B's wait (created -> first claimed by a worker) is compared with its wait on an idle
platform. Ends with one line: `fairness: b_wait_s=<s> a_runs=<n> b_wait_vs_empty=<ratio>`
"""

import argparse
import os
import statistics
import time

from runs.agents import Agent
from runs.transitions import finish

quick = Agent("bench_quick", version=1)


@quick.step(start=True, next=[])
def work(ctx, state):
    time.sleep(state["seconds"])
    return finish(True)


def b_wait(platform, b_tenant: str, seconds: float) -> float:
    from runs.models import Run
    from runs.services import run_start

    with platform.tenant(b_tenant):
        run = run_start(agent="bench_quick", input={"seconds": seconds}).run
        started = platform.wait_for(
            lambda: Run.objects.filter(id=run.id).exclude(started_at=None)
            .values_list("started_at", flat=True).first(), timeout=300, interval=0.005,
            what="B's run to start")
        platform.wait_for(lambda: Run.objects.get(id=run.id).is_finished, timeout=60)
        return (started - run.created_at).total_seconds()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench fairness")
    parser.add_argument("--a-runs", type=int, default=500)
    parser.add_argument("--step-seconds", type=float, default=0.05)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--samples", type=int, default=5)
    args = parser.parse_args(argv)
    slots = args.workers * args.concurrency
    env = {"AGENT_MODULES": "agents,bench.fairness", "DISPATCH_TICK_SECONDS": "0.5",
           # The broker holds no more than the workers can start now: order is decided in
           # PostgreSQL at the last moment, where fairness is computed.
           "DISPATCH_MAX_IN_FLIGHT": str(slots), "RUN_TENANT_MAX_IN_FLIGHT": str(slots)}
    os.environ.update(env)
    from django.conf import settings

    settings.DISPATCH_MAX_IN_FLIGHT = slots
    settings.RUN_TENANT_MAX_IN_FLIGHT = slots
    from bench.platform import BenchPlatform
    from runs.models import Run
    from runs.services import run_start

    with BenchPlatform(env=env, workers=args.workers, concurrency=args.concurrency) as platform:
        with platform.tenant("tenant_a"):
            pass
        b_wait(platform, "tenant_b", args.step_seconds)  # warm-up
        idle = statistics.median(b_wait(platform, "tenant_b", args.step_seconds)
                                 for _ in range(args.samples))
        loaded = []
        for _ in range(args.samples):
            with platform.tenant("tenant_a"):
                flood = [run_start(agent="bench_quick", input={"seconds": args.step_seconds})
                         .run.id for _ in range(args.a_runs // args.samples)]
            loaded.append(b_wait(platform, "tenant_b", args.step_seconds))
            with platform.tenant("tenant_a"):
                waiting = Run.objects.filter(id__in=flood, status="queued").count()
            print(f"B waited {loaded[-1]:.3f}s with {waiting} of A's runs still queued")
        with platform.tenant("tenant_a"):
            platform.wait_for(lambda: not Run.objects.filter(
                status__in=["queued", "running"]).exists(), timeout=600, interval=0.5,
                what="A's flood to drain")
            a_done = Run.objects.filter(status="succeeded").count()
    loaded_median = statistics.median(loaded)
    print(f"idle wait p50={idle:.3f}s; loaded wait p50={loaded_median:.3f}s "
          f"(each sample: {args.a_runs // args.samples} of A's runs submitted just before B's)")
    print(f"fairness: b_wait_s={loaded_median:.3f} a_runs={a_done} "
          f"b_wait_vs_empty={loaded_median / idle:.2f}")
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
