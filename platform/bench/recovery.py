"""`python -m bench recovery`: kill -9 workers mid-step and time how long until the run's next
step starts on another worker.

Real worker and beat processes on the bench database and a Redis db of its own. Each kill
waits for a run that is mid-step on one of the bench's workers, kills that worker's whole
process group (a lost host), starts a replacement worker (the fleet keeps its size), and
measures from the kill to the moment a different worker claims the run (its lease epoch moves
on). The runs are long enough (`--steps` sized from the kills unless given) that every kill
finds a victim.

Steps are observed outside the database: each execution of `plod` appends one line
"<run> <n> <token of the execution it continues> <its own token> <pid>" to a file, and carries
its token forward in the state it commits. An execution was committed if a later execution
continues it (the closing step `done` continues the last one). `duplicate_steps_committed`
counts, per run and step n, the committed executions beyond the first: work done twice and
both kept, which a unique constraint on checkpoints cannot see (a re-run at a new visit).
Executions cut short by a kill are re-run, not duplicates. Ends with one line:
`recovery: lease_ttl=<s> kills=<n> p50=<s> max=<s> lost_runs=<n> duplicate_steps_committed=<n>`
"""

import argparse
import math
import os
import signal
import statistics
import time
import uuid
from collections import defaultdict
from pathlib import Path

from runs.agents import Agent
from runs.transitions import finish, goto

plodder = Agent("bench_plodder", version=2)


def execution_record(path: str, line: str) -> None:
    """One write with O_APPEND: lines from concurrent workers never interleave."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


@plodder.step(start=True, next=["plod", "done"])
def plod(ctx, state):
    n, token = state.get("n", 0) + 1, uuid.uuid4().hex[:16]
    execution_record(state["log"], f"{ctx.run_id} {n} {state.get('token', '-')} {token} "
                                   f"{os.getpid()}")
    time.sleep(state["seconds"])
    return goto("done" if n >= state["steps"] else "plod", update={"n": n, "token": token})


@plodder.step(next=[])
def done(ctx, state):
    execution_record(state["log"], f"{ctx.run_id} {state['n'] + 1} {state['token']} - "
                                   f"{os.getpid()}")
    return finish(state["n"])


def duplicates_committed(log: Path) -> int:
    """Per (run, n): how many distinct executions of step n later executions continued, - 1."""
    continued: dict[tuple[str, int], set[str]] = defaultdict(set)
    for line in log.read_text().splitlines():
        run, n, previous, _token, _pid = line.split()
        if previous != "-":
            continued[(run, int(n) - 1)].add(previous)
    return sum(len(tokens) - 1 for tokens in continued.values())


def steps_needed(*, kills: int, runs: int, workers: int, step_seconds: float,
                 lease_ttl: float) -> int:
    """Enough steps that runs are still mid-step when the last kill looks for a victim: each
    kill costs about a lease TTL to recover and ~10 s to start the replacement worker."""
    seconds = 2 * kills * (2 * lease_ttl + 10)
    return math.ceil(seconds * min(workers, runs) / (runs * step_seconds))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench recovery")
    parser.add_argument("--kills", type=int, default=6)
    parser.add_argument("--runs", type=int, default=6)
    parser.add_argument("--steps", type=int, default=0,
                        help="steps per run (default: enough for every kill to find a victim)")
    parser.add_argument("--step-seconds", type=float, default=0.5)
    parser.add_argument("--lease-ttl", type=float, default=2.0)
    parser.add_argument("--workers", type=int, default=3)
    args = parser.parse_args(argv)
    args.steps = args.steps or steps_needed(kills=args.kills, runs=args.runs,
                                            workers=args.workers, step_seconds=args.step_seconds,
                                            lease_ttl=args.lease_ttl)

    env = {"RUN_LEASE_SECONDS": str(args.lease_ttl),
           "RUN_HEARTBEAT_SECONDS": str(args.lease_ttl / 4),
           "DISPATCH_CHECK_AFTER_SECONDS": str(args.lease_ttl / 4),
           "DISPATCH_TICK_SECONDS": "0.25", "RUN_SLICE_SECONDS": "1",
           "AGENT_MODULES": "agents,bench.recovery"}
    os.environ.update(env)  # this process dispatches too
    from django.conf import settings

    settings.RUN_LEASE_SECONDS = args.lease_ttl
    from bench.platform import BenchPlatform
    from runs.models import Run
    from runs.services import run_start

    with BenchPlatform(env=env, workers=args.workers) as platform, platform.tenant("bench"):
        log = platform.dir / "executions.log"
        runs = [run_start(agent="bench_plodder", input={
            "steps": args.steps, "seconds": args.step_seconds, "log": str(log)}).run.id
            for _ in range(args.runs)]
        recoveries = []
        for kill in range(args.kills):
            def victim():
                """A run mid-step on a live worker of ours (not one whose worker just died)."""
                for run in Run.objects.filter(id__in=runs, status="running").exclude(
                        lease_owner="").order_by("?"):
                    worker = platform.worker_of(int(run.lease_owner.rsplit(":", 1)[1]))
                    if worker is not None:
                        return run, worker
                return None

            victim_run, worker = platform.wait_for(victim, timeout=120, interval=0.05,
                                                   what="a run mid-step on a live worker")
            epoch = victim_run.lease_epoch
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
        duplicates = duplicates_committed(log)
        executions = len(log.read_text().splitlines())
        wrong_counts = Run.objects.filter(id__in=runs, status="succeeded").exclude(
            steps_taken=args.steps + 1).count()
    print(f"runs={args.runs} steps={args.steps} step_seconds={args.step_seconds} "
          f"executions_observed={executions} (committed steps {args.runs * (args.steps + 1)}) "
          f"wrong_step_counts={wrong_counts}")
    print(f"recovery: lease_ttl={args.lease_ttl:g} kills={len(recoveries)} "
          f"p50={statistics.median(recoveries):.2f} max={max(recoveries):.2f} "
          f"lost_runs={lost} duplicate_steps_committed={duplicates}")
    return 0 if lost == 0 and duplicates == 0 else 1


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
