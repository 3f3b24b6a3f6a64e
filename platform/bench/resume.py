"""`python -m bench resume`: dormant runs cost rows, not processes, and wake fast.

1. Parks N runs (default 100,000) in one tenant schema by bulk SQL: each a `waiting` run row,
   its parked checkpoint and an open event gate (kind slack.message, key = its own channel).
   That is exactly what `Harness._park` leaves behind, written in one statement per table
   instead of running N first steps through workers (which would take an hour here).
2. Shows that nothing is held for them: Celery active tasks, worker threads and PostgreSQL
   connections, measured before and after parking.
3. Starts gunicorn as deploy/production runs it and sends 1,000 signed Slack Events API
   requests over real HTTP (paced, default 10/s, by a pool of `--senders` threads, so a slow
   answer delays no later send until all are busy) at random parked runs. Latency = the run's lease claim
   (`started_at`, left NULL by the bulk insert so the resume's claim sets it) minus the moment
   the request was due: every hop between the webhook and the worker that claims the run.
4. `--sweep`: then the same at 10, 20, 40, 80 … events/s (`--sweep-events` each, on other
   parked runs, each round drained before the next) until p50 passes 100 ms.

Runs on a database, Redis db and queue of its own (by BENCH_SLOT, else TEST_SLOT). Ends with
the line `resume: parked=<n> worker_slots_held=<n> p50_ms=<…> p99_ms=<…>`, and with `--sweep`
a second one: `resume_rate: p50_over_100ms_at=<n>/s p50_ms_by_rate=<rate>:<ms>,…`
"""

import argparse
import http.client
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from bench.database import slot_environment
from runs.agents import Agent
from runs.transitions import finish, wait_for_event

OWN_DJANGO_SETUP = True  # it picks its own database, Redis db and queue (by slot)
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



def slack_event_body(team_id: str, event: dict) -> bytes:
    """An Events API `event_callback` as Slack sends it (its own event id each)."""
    return json.dumps({"token": "unused", "team_id": team_id, "api_app_id": "A1",
                       "type": "event_callback", "event_id": f"Ev{uuid.uuid4().hex}",
                       "event_time": int(time.time()), "event": event}).encode()

class WebServer:
    """The webhooks as production serves them: gunicorn with deploy/production's settings
    (threaded workers keeping their connections for CONN_MAX_AGE). runserver, measured until
    2026-12-03, starts a thread and so a new PostgreSQL connection per request: a fifth of a
    webhook's time."""

    def __init__(self, port: int, env: dict, log: Path):
        self.port = port
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "-c", "deploy/production/gunicorn.conf.py",
             "--access-logfile", "/dev/null"],
            cwd=ROOT, env={**os.environ, **env, "DJANGO_SETTINGS_MODULE": "bench.settings",
                           "WEB_BIND": f"127.0.0.1:{port}"},
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
            assert self.process.poll() is None, "gunicorn exited"
            try:
                return self.post("/webhooks/slack/00000000-0000-0000-0000-000000000000/events",
                                 b"{}", {"Content-Type": "application/json"}) == 404
            except OSError:
                return False

        wait_for(answers, timeout=60, interval=0.2, what="gunicorn to answer")
        return self

    def stop(self):
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=15)


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered)) - 1))]




@dataclass
class Round:
    rate: float
    sent_per_s: float
    latencies: list[float]  # ms, sent -> run claimed
    to_received: list[float]  # ms, sent -> the inbox row's received_at
    answered: list[float]  # ms, sent -> the webhook's 200

    @property
    def p50(self) -> float:
        return statistics.median(self.latencies)

    @property
    def p99(self) -> float:
        return percentile(self.latencies, 99)


class Sender:
    """Signed Slack events, each due at its planned time, sent by a pool of threads (a slow
    answer delays no later send until all are busy). Each is timed from when it was due, so a
    backlog in the pool counts. Few threads: every request holds a PostgreSQL connection, and
    the server's max_connections is shared."""

    def __init__(self, web: "WebServer", slack, secret: str, threads: int):
        self.web, self.slack, self.secret, self.threads = web, slack, secret, threads
        self.path = f"/webhooks/slack/{slack.id}/events"
        self.failures: list[str] = []
        self.lock = threading.Lock()

    def send_all(self, channels: list[str], rate: float) -> tuple[dict, dict, float]:
        from integrations.webhooks.services import slack_signature

        sent_at: dict[str, float] = {}
        answered_at: dict[str, float] = {}

        def send(channel: str, due: float) -> None:
            body = slack_event_body(self.slack.team_id, {
                "type": "message", "channel": channel, "user": "U1", "text": f"go {channel}"})
            ts = str(int(time.time()))
            headers = {"Content-Type": "application/json", "X-Slack-Request-Timestamp": ts,
                       "X-Slack-Signature": slack_signature(secret=self.secret, timestamp=ts,
                                                            body=body)}
            sent_at[channel] = due
            status = self.web.post(self.path, body, headers)
            answered_at[channel] = time.time()
            if status != 200:
                with self.lock:
                    self.failures.append(f"webhook answered {status} for {channel}")

        begin = time.monotonic()
        with ThreadPoolExecutor(max_workers=self.threads) as pool:
            for i, channel in enumerate(channels):
                pause = begin + i / rate - time.monotonic()
                if pause > 0:
                    time.sleep(pause)  # pacing the sender, not waiting on a result
                pool.submit(send, channel, time.time())
        if self.failures:
            raise SystemExit("; ".join(self.failures[:5]))
        return sent_at, answered_at, time.monotonic() - begin


def round_measure(platform, sender: Sender, channels: list[str], rate: float) -> Round:
    """Send one event to each of `channels`' parked runs at `rate`; wait for every run to be
    claimed and to finish; return the latencies."""
    from runs.approvals.models import InboundEvent
    from runs.models import Run

    sent_at, answered_at, seconds = sender.send_all(channels, rate)
    resumed = Run.objects.filter(input__channel__in=channels)
    platform.wait_for(lambda: resumed.exclude(started_at=None).count() == len(channels),
                      timeout=300, interval=0.2, what="every targeted run to start")
    started = {i["channel"]: s.timestamp() for i, s in resumed.values_list("input", "started_at")}
    received = {e.key: e.received_at.timestamp()
                for e in InboundEvent.objects.filter(key__in=channels)}
    platform.wait_for(lambda: resumed.filter(status="succeeded").count() == len(channels),
                      timeout=300, interval=0.2, what="the resumed runs to finish")
    return Round(rate=rate, sent_per_s=len(channels) / seconds if seconds else rate,
                 latencies=[(started[c] - sent_at[c]) * 1000 for c in channels],
                 to_received=[(received[c] - sent_at[c]) * 1000 for c in channels],
                 answered=[(answered_at[c] - sent_at[c]) * 1000 for c in channels])


def round_report(r: Round) -> str:
    return (f"{r.rate:g}/s (sent at {r.sent_per_s:.1f}/s): p50 {r.p50:.0f} ms, p99 {r.p99:.0f} ms, "
            f"max {max(r.latencies):.0f} ms; p50 sent -> event received "
            f"{statistics.median(r.to_received):.0f} ms, -> answered 200 "
            f"{statistics.median(r.answered):.0f} ms")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench resume")
    parser.add_argument("--parked", type=int, default=100_000)
    parser.add_argument("--events", type=int, default=1_000)
    parser.add_argument("--rate", type=float, default=10.0, help="events sent per second")
    parser.add_argument("--sweep", action="store_true",
                        help="then double the rate from --sweep-from until p50 passes 100 ms")
    parser.add_argument("--sweep-from", type=float, default=10.0)
    parser.add_argument("--sweep-events", type=int, default=300, help="events per sweep rate")
    parser.add_argument("--sweep-max", type=float, default=1280.0)
    parser.add_argument("--senders", type=int, default=8, help="threads sending the events")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--port", type=int, default=0, help="the web server's port (default by slot)")
    args = parser.parse_args(argv)
    # SIGTERM (a timeout) unwinds like Ctrl-C: the workers, beat and web server are stopped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    slot = slot_environment("resume")
    import django

    django.setup()
    env = {"AGENT_MODULES": "agents,bench.resume", "DISPATCH_TICK_SECONDS": "0.5",
           "DISPATCH_MAX_IN_FLIGHT": "16", "RUN_TENANT_MAX_IN_FLIGHT": "16"}
    os.environ.update(env)
    from django.conf import settings

    settings.DISPATCH_MAX_IN_FLIGHT = settings.RUN_TENANT_MAX_IN_FLIGHT = 16
    from django.db.models import Count

    from bench.platform import BenchPlatform
    from integrations.webhooks.services import slack_connection_create
    from runs.models import Run, RunEvent
    from tenants.models import Tenant

    with open("/proc/loadavg") as f:
        print(f"load average before: {' '.join(f.read().split()[:3])}")
    secret = os.urandom(16).hex()
    rounds: list[Round] = []
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

        web = WebServer(args.port or 18765 + slot, platform.env, platform.logs / "gunicorn.log")
        try:
            web.wait_ready(platform.wait_for)
            sender = Sender(web, slack, secret, args.senders)
            unused = [f"C{n}" for n in random.sample(range(1, args.parked + 1), args.parked)]
            with platform.tenant("resume_bench"):
                first = round_measure(platform, sender, [unused.pop() for _ in
                                                         range(args.events)], args.rate)
                print(f"sent {args.events} signed Slack events over HTTP (gunicorn): "
                      f"{round_report(first)}")
                rate = args.sweep_from
                while args.sweep and rate <= args.sweep_max:
                    if len(unused) < args.sweep_events:
                        print(f"  sweep stopped: fewer than {args.sweep_events} parked runs left")
                        break
                    rounds.append(round_measure(platform, sender, [unused.pop() for _ in
                                                                   range(args.sweep_events)], rate))
                    print(f"  sweep {round_report(rounds[-1])}", flush=True)
                    if rounds[-1].p50 > 100:
                        break
                    rate *= 2
                twice = (RunEvent.objects.filter(kind="event_received")
                         .values("run_id").annotate(n=Count("id")).filter(n__gt=1).count())
                untouched = Run.objects.filter(status="waiting").count()
                woken = parked - untouched
        finally:
            web.stop()
    with open("/proc/loadavg") as f:
        print(f"load average after: {' '.join(f.read().split()[:3])}")
    print(f"resumed {woken} runs, {twice} more than once; {untouched} still parked")
    print(f"resume: parked={parked} worker_slots_held={slots_held} p50_ms={first.p50:.0f} "
          f"p99_ms={first.p99:.0f}")
    if args.sweep:
        over = next((f"{r.rate:g}/s" for r in rounds if r.p50 > 100),
                    f"none_up_to_{rounds[-1].rate:g}/s" if rounds else "none")
        by_rate = ",".join(f"{r.rate:g}:{r.p50:.0f}" for r in rounds)
        print(f"resume_rate: p50_over_100ms_at={over} p50_ms_by_rate={by_rate}")
    return 0
