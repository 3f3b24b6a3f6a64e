"""`python -m bench resume`: dormant runs cost rows, not processes, and wake fast.

1. Parks N runs (default 100,000) in one tenant schema by bulk SQL: each a `waiting` run row,
   its parked checkpoint and an open event gate (kind slack.message, key = its own channel).
   That is exactly what `Harness._park` leaves behind, written in one statement per table
   instead of running N first steps through workers (which would take an hour here).
2. Shows that nothing is held for them: Celery active tasks, worker threads and PostgreSQL
   connections, measured before and after parking.
3. Starts `manage.py runserver` and sends 1,000 signed Slack Events API requests over real HTTP
   (paced, default 10/s) at random parked runs. Latency = the run's lease claim
   (`started_at`, left NULL by the bulk insert so the resume's claim sets it) minus the moment
   the request was sent: HTTP + verification + dedupe + enqueue, the worker's event_deliver,
   the dispatcher, and the next worker claiming the run.

Ends with one line: `resume: parked=<n> worker_slots_held=<n> p50_ms=<…> p99_ms=<…>`
"""

import argparse
import http.client
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

from runs.agents import Agent
from runs.transitions import finish, wait_for_event

ROOT = Path(__file__).resolve().parents[2]  # platform/<package>/ -> the checkout

parked_agent = Agent("bench_parked", version=1)


@parked_agent.step(start=True, next=["resumed"])
def park(ctx, state):
    return wait_for_event("slack.message", state["channel"], then="resumed")


@parked_agent.step(next=[])
def resumed(ctx, state):
    return finish(state["event"]["payload"].get("text"))


def runs_park(n: int) -> float:
    """Bulk-insert n parked runs (run, checkpoint at visit 1, open gate) in the current schema."""
    from django.db import connection, transaction

    from runs.agents import registry

    agent = registry.get("bench_parked")
    started = time.monotonic()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("CREATE TEMP TABLE parked ON COMMIT DROP AS "
                       "SELECT gen_random_uuid() AS id, n FROM generate_series(1, %s) n", [n])
        cursor.execute(
            """INSERT INTO runs_run (id, agent, agent_version, topology_hash, status, durability,
                   input, error, waiting_reason, max_steps, max_wall_seconds, steps_taken,
                   active_seconds, cancel_requested, lease_owner, lease_epoch, created_at,
                   updated_at)
               SELECT id, %s, %s, %s, 'waiting', 'sync', jsonb_build_object('channel', 'C' || n),
                   '', 'event slack.message:C' || n, 1000, 3600, 1, 0, false, '', 1, now(), now()
                 FROM parked""", [agent.name, agent.version, agent.topology_hash])
        cursor.execute(
            """INSERT INTO runs_checkpoint (run_id, visit, step, state, log_offsets, agent_version,
                   topology_hash, created_at)
               SELECT id, 1, 'resumed', jsonb_build_object('channel', 'C' || n), '{}', %s, %s,
                   now() FROM parked""", [agent.version, agent.topology_hash])
        cursor.execute(
            """INSERT INTO approvals_eventgate (run_id, visit, kind, key, status, "then", on_timeout,
                   created_at)
               SELECT id, 1, 'slack.message', 'C' || n, 'open', 'resumed', '', now() FROM parked""")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE runs_run; ANALYZE runs_checkpoint; ANALYZE approvals_eventgate")
    return time.monotonic() - started


def held(platform) -> dict:
    """What the platform holds right now: active Celery tasks, worker threads, DB connections."""
    from django.conf import settings
    from django.db import connection

    from agentplatform.celery import app

    active = app.control.inspect(timeout=1.0).active() or {}
    threads = 0
    for worker in platform.workers:
        for pid in worker.pids():
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except FileNotFoundError:
                continue
            threads += int(next(line.split()[1] for line in status.splitlines()
                                if line.startswith("Threads:")))
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s",
                       [settings.DATABASES["default"]["NAME"]])
        connections = cursor.fetchone()[0]
    tasks = [task for tasks in active.values() for task in tasks]
    return {"active_tasks": len(tasks),  # includes beat's dispatch tick, if it runs right now
            "run_tasks": sum(task.get("name", "").startswith("runs.advance") for task in tasks),
            "worker_threads": threads, "db_connections": connections}


class WebServer:
    def __init__(self, port: int, env: dict, log: Path):
        self.port = port
        self.process = subprocess.Popen(
            [sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload"],
            cwd=ROOT, env={**os.environ, **env, "DJANGO_SETTINGS_MODULE": "bench.settings"},
            stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)

    def post(self, path: str, body: bytes, headers: dict) -> int:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request("POST", path, body, headers)
            response = conn.getresponse()
            response.read()
            return response.status
        finally:
            conn.close()

    def wait_ready(self, wait_for):
        def answers():
            assert self.process.poll() is None, "runserver exited"
            try:
                return self.post("/webhooks/slack/00000000-0000-0000-0000-000000000000/events",
                                 b"{}", {"Content-Type": "application/json"}) == 404
            except OSError:
                return False

        wait_for(answers, timeout=60, interval=0.2, what="runserver to answer")
        return self

    def stop(self):
        import signal

        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=15)


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered)) - 1))]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench resume")
    parser.add_argument("--parked", type=int, default=100_000)
    parser.add_argument("--events", type=int, default=1_000)
    parser.add_argument("--rate", type=float, default=10.0, help="events sent per second")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--port", type=int, default=18765)
    args = parser.parse_args(argv)
    env = {"AGENT_MODULES": "agents,bench.resume", "DISPATCH_TICK_SECONDS": "0.5",
           "DISPATCH_MAX_IN_FLIGHT": "16", "RUN_TENANT_MAX_IN_FLIGHT": "16"}
    os.environ.update(env)
    from django.conf import settings

    settings.DISPATCH_MAX_IN_FLIGHT = settings.RUN_TENANT_MAX_IN_FLIGHT = 16
    from django.db.models import Count

    from bench.platform import BenchPlatform
    from integrations.webhooks.services import slack_connection_create, slack_signature
    from runs.models import Run, RunEvent
    from tenants.models import Tenant
    from tests.webhooks.slack import event_body

    secret = os.urandom(16).hex()
    with BenchPlatform(env=env, workers=args.workers, concurrency=args.concurrency) as platform:
        with platform.tenant("resume_bench"):
            pass
        tenant = Tenant.objects.get(schema_name="resume_bench")
        slack = slack_connection_create(tenant=tenant, team_id="TBENCH", signing_secret=secret)
        time.sleep(2)  # let the workers settle after start-up before the "before" snapshot
        before = held(platform)
        with platform.tenant("resume_bench"):
            seconds = runs_park(args.parked)
            parked = Run.objects.filter(status="waiting").count()
        after = held(platform)
        print(f"parked {parked} runs by bulk SQL in schema resume_bench in {seconds:.1f}s "
              "(run rows, parked checkpoints, open gates; not driven through workers)")
        for name in before:
            print(f"  {name:15} before parking {before[name]:5}   after {after[name]:5}")
        slots_held = after["run_tasks"]  # worker slots running a run (parked ones need none)

        web = WebServer(args.port, platform.env, platform.logs / "runserver.log")
        try:
            web.wait_ready(platform.wait_for)
            targets = random.sample(range(1, args.parked + 1), args.events)
            sent_at: dict[str, float] = {}
            path = f"/webhooks/slack/{slack.id}/events"
            begin = time.monotonic()
            for i, n in enumerate(targets):
                body = event_body(slack.team_id, {"type": "message", "channel": f"C{n}",
                                                  "user": "U1", "text": f"go {n}"})
                ts = str(int(time.time()))
                headers = {"Content-Type": "application/json", "X-Slack-Request-Timestamp": ts,
                           "X-Slack-Signature": slack_signature(secret=secret, timestamp=ts,
                                                                body=body)}
                pause = begin + i / args.rate - time.monotonic()
                if pause > 0:
                    time.sleep(pause)  # pacing the sender, not waiting on a result
                sent_at[f"C{n}"] = time.time()
                status = web.post(path, body, headers)
                if status != 200:
                    raise SystemExit(f"webhook answered {status} for C{n}")
            print(f"sent {args.events} signed Slack events over HTTP (runserver) in "
                  f"{time.monotonic() - begin:.1f}s")
            with platform.tenant("resume_bench"):
                resumed = Run.objects.filter(input__channel__in=list(sent_at))
                platform.wait_for(lambda: resumed.exclude(started_at=None).count() == args.events,
                                  timeout=300, interval=0.5, what="every targeted run to start")
                latencies = [(started.timestamp() - sent_at[run_input["channel"]]) * 1000
                             for run_input, started in resumed.values_list("input", "started_at")]
                from runs.approvals.models import InboundEvent

                received = {e.key: e.received_at.timestamp() for e in
                            InboundEvent.objects.filter(key__in=list(sent_at))}
                started_of = {i["channel"]: s.timestamp()
                              for i, s in resumed.values_list("input", "started_at")}
                to_worker = [(received[c] - sent_at[c]) * 1000 for c in sent_at]
                to_claim = [(started_of[c] - received[c]) * 1000 for c in sent_at]
                platform.wait_for(lambda: resumed.filter(status="succeeded").count() == args.events,
                                  timeout=120, interval=0.5, what="the resumed runs to finish")
                twice = (RunEvent.objects.filter(kind="event_received")
                         .values("run_id").annotate(n=Count("id")).filter(n__gt=1).count())
                untouched = Run.objects.filter(status="waiting").count()
        finally:
            web.stop()
    p50, p99 = statistics.median(latencies), percentile(latencies, 99)
    print(f"  p50: sent -> event recorded by a worker {statistics.median(to_worker):.0f} ms; "
          f"event recorded -> run claimed {statistics.median(to_claim):.0f} ms")
    print(f"resumed {len(latencies)} runs, {twice} more than once; {untouched} still parked; "
          f"latency max {max(latencies):.0f} ms")
    print(f"resume: parked={parked} worker_slots_held={slots_held} p50_ms={p50:.0f} "
          f"p99_ms={p99:.0f}")
    return 0
