"""`python -m bench chaos`: many runs that touch the world, under kill -9s of workers, a broker
FLUSHDB and a PostgreSQL restart; counted at the receivers, not in the database.

Real worker and beat processes, a real web server (`manage.py runserver`) for Slack's Events
API, and local receivers in this process (HTTP servers, one thread per request) on a database,
a Redis db and a queue of the bench's own (suffixed by BENCH_SLOT, else TEST_SLOT).

Each run of the agent `bench_chaos` takes `--steps` visits of its step `work`. Every visit
makes a ledger effect through the `webhook` connector (a receiver that deduplicates by
Idempotency-Key); the first visit queues an outbox notification (`ctx.notify`) through the
`slack` connector, for every `--slow-every`-th run to a channel whose receiver posts it and
answers only `--slow-seconds` later, for the others to a prompt one; the last visit
makes a ledger effect through `slack` (chat.postMessage: Slack ignores keys). Every
`--wait-every`-th run then waits for a Slack message event on a channel of its own, which the
bench sends, signed, through the web server once the run waits; the resumed step makes one more
webhook effect. Every message carries a logical id, `<run id>/<step visit>/<effect name>`.

Counted at the end (see docs/benchmarks.md):
  lost_effects         logical messages of succeeded runs that never reached their receiver
                       (ledger effects and notifications)
  duplicate_effects    per ledger message: webhook, distinct keys - 1; Slack, deliveries - 1
  outbox_double_sends  per notification: deliveries - 1 (its receiver cannot deduplicate)
  lost_wakeups         events answered 200 whose run never made its post-event effect
  stuck_runs           runs that had not succeeded by the deadline (still running or queued,
                       parked for a person, failed or cancelled)
Ends with one line:
`chaos: runs=<n> kills=<n> broker_flushes=<n> pg_restarts=<n> lost_effects=<n>
duplicate_effects=<n> outbox_double_sends=<n> lost_wakeups=<n> stuck_runs=<n>`
and exits 1 unless every count after pg_restarts is 0.
"""

import argparse
import json
import os
import random
import signal
import subprocess
import time
from collections import Counter, defaultdict

from bench.database import slot_environment
from runs.agents import Agent
from runs.transitions import finish, goto, wait_for_event
from tests.support.fakes.slack import FakeSlack
from tests.support.fakes.webhook import FakeWebhook

OWN_DJANGO_SETUP = True  # it picks its own database, Redis db and queue (by slot)
FAST_CHANNEL = "CFAST"  # ledger effects through Slack
NOTE_CHANNEL, SLOW_CHANNEL = "CNOTE", "CSLOW"  # notifications: a prompt receiver, a slow one
SLACK_TOKEN = "xoxb-bench-chaos"

chaos_agent = Agent("bench_chaos", version=1)


@chaos_agent.step(start=True, next=["work", "woken"])
def work(ctx, state):
    n = state.get("n", 0) + 1
    where = f"{ctx.run_id}/work{n}"
    ctx.effect("hook", "webhook", payload={"logical": f"{where}/hook"})
    if n == 1:
        ctx.notify("note", "slack", channel=state["notify"], text=f"{where}/note")
    time.sleep(state["seconds"])
    if n < state["steps"]:
        return goto("work", update={"n": n})
    ctx.effect("post", "slack", channel=FAST_CHANNEL, text=f"{where}/post")
    if state.get("channel"):
        return wait_for_event("slack.message", state["channel"], then="woken", update={"n": n})
    return finish(n)


@chaos_agent.step(next=[])
def woken(ctx, state):
    ctx.effect("hook", "webhook", payload={"logical": f"{ctx.run_id}/woken/hook"})
    return finish(state["n"])


def expected_messages(run_id, run_input: dict) -> dict[str, list[str]]:
    """What a succeeded run must have delivered, by receiver (the agent above, in words)."""
    steps = run_input["steps"]
    hooks = [f"{run_id}/work{n}/hook" for n in range(1, steps + 1)]
    if run_input.get("channel"):
        hooks.append(f"{run_id}/woken/hook")
    return {"webhook": hooks, "slack": [f"{run_id}/work{steps}/post"],
            "notes": [f"{run_id}/work1/note"]}


def quiet(request, client_address) -> None:
    """A worker killed mid-request leaves a broken pipe: that is the point, not an error."""


class LedgerReceiver(FakeWebhook):
    """The webhook receiver: it deduplicates by Idempotency-Key, so a repeat under the same key
    is harmless; the same logical message under a second key is a duplicate."""

    def keys_by_logical(self) -> dict[str, set[str]]:
        with self.lock:
            keys: dict[str, set[str]] = defaultdict(set)
            for delivery in self.deliveries:
                try:
                    keys[json.loads(delivery["body"])["logical"]].add(delivery["key"])
                except (ValueError, KeyError, TypeError):
                    keys["<unreadable>"].add(delivery["key"])
            return keys


class SlackReceiver(FakeSlack):
    """Slack's Web API: ignores keys (any second post is a second message people see). The
    notification channel is the slow receiver: it posts the message, then answers late."""

    configurable = (*FakeSlack.configurable, "slow_seconds")

    def reset(self) -> None:
        super().reset()
        with self.lock:
            self.slow_seconds = getattr(self, "slow_seconds", 4.0)

    def post_message(self, params):
        answer = super().post_message(params)
        if params.get("channel") == SLOW_CHANNEL:
            time.sleep(self.slow_seconds)
        return answer

    def posts_by_logical(self, channel: str) -> Counter:
        with self.lock:
            return Counter(m.get("text", "") for m in self.messages.get(channel, []))




def db_retry(read, *, what: str, timeout: float = 120.0):
    """A read from this process that survives the PostgreSQL restart (reconnect and retry)."""
    from django.db import Error, connections

    deadline = time.monotonic() + timeout
    while True:
        try:
            return read()
        except Error:  # OperationalError while it restarts, InterfaceError on the dead socket
            connections.close_all()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


class SlackEvents:
    """Sends each waiting run its Slack message event through the web server, as Slack does:
    signed, and retried with the same event_id until answered 200."""

    def __init__(self, web, connection, secret: str):
        self.web, self.connection, self.secret = web, connection, secret
        self.bodies: dict[str, bytes] = {}  # channel -> the event (fixed event_id)
        self.tries: Counter = Counter()
        self.accepted: dict[str, float] = {}  # channel -> when it was answered 200

    def send_due(self, channels: list[str]) -> None:
        from integrations.webhooks.services import slack_signature
        from tests.webhooks.slack import event_body

        for channel in channels:
            if channel in self.accepted:
                continue
            body = self.bodies.setdefault(channel, event_body(
                self.connection.team_id,
                {"type": "message", "channel": channel, "user": "U1", "text": f"go {channel}"}))
            ts = str(int(time.time()))
            headers = {"Content-Type": "application/json", "X-Slack-Request-Timestamp": ts,
                       "X-Slack-Signature": slack_signature(secret=self.secret, timestamp=ts,
                                                            body=body)}
            if self.tries[channel]:
                headers["X-Slack-Retry-Num"] = str(self.tries[channel])
                headers["X-Slack-Retry-Reason"] = "http_error"
            self.tries[channel] += 1
            try:
                status = self.web.post(f"/webhooks/slack/{self.connection.id}/events", body,
                                       headers)
            except OSError:
                continue  # the server did not answer: Slack retries, and so do we
            if status == 200:
                self.accepted[channel] = time.monotonic()


def postgres_restart() -> None:
    clusters = sorted(os.listdir("/etc/postgresql"))
    subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", clusters[-1], "main",
                    "restart"], check=True, timeout=120)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench chaos")
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--steps", type=int, default=3, help="visits of `work` per run")
    parser.add_argument("--step-seconds", type=float, default=0.3)
    parser.add_argument("--wait-every", type=int, default=4,
                        help="every n-th run waits for a Slack event (0: none)")
    parser.add_argument("--slow-seconds", type=float, default=4.0,
                        help="how late the slow notification receiver answers")
    parser.add_argument("--slow-every", type=int, default=2,
                        help="every n-th run notifies the slow receiver, the others a fast one")
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--kill-every", type=float, default=6.0, help="seconds between kills")
    parser.add_argument("--no-broker-flush", action="store_true")
    parser.add_argument("--no-pg-restart", action="store_true",
                        help="skip the PostgreSQL restart (it hurts everyone on the machine)")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--deadline", type=float, default=450.0,
                        help="seconds from the first run's start to the count")
    parser.add_argument("--port", type=int, default=0, help="web server port (default by slot)")
    args = parser.parse_args(argv)

    slot = slot_environment("chaos")
    slots = args.workers * args.concurrency
    env = {"AGENT_MODULES": "agents,bench.chaos", "CONNECTOR_ALLOW_PRIVATE_DESTINATIONS": "true",
           "CONNECTOR_TIMEOUT_SECONDS": str(max(15.0, 3 * args.slow_seconds)),
           "RUN_LEASE_SECONDS": "4", "RUN_HEARTBEAT_SECONDS": "1",
           "DISPATCH_CHECK_AFTER_SECONDS": "1", "DISPATCH_TICK_SECONDS": "0.5",
           "DISPATCH_REDELIVER_SECONDS": "10", "RUN_SLICE_SECONDS": "2",
           "OUTBOX_SWEEP_SECONDS": "2",
           "DISPATCH_MAX_IN_FLIGHT": str(slots), "RUN_TENANT_MAX_IN_FLIGHT": str(slots)}
    os.environ.update(env)  # this process starts runs and serves nothing else
    import django

    django.setup()
    import redis
    from django.conf import settings
    from django_tenants.utils import tenant_context

    from bench.platform import BenchPlatform
    from bench.resume import WebServer
    from integrations.services import credential_set
    from integrations.webhooks.services import slack_connection_create
    from runs.models import Run
    from runs.services import run_start
    from tenants.models import Tenant

    settings.DISPATCH_MAX_IN_FLIGHT = settings.RUN_TENANT_MAX_IN_FLIGHT = slots
    hooks = LedgerReceiver().start()
    hooks.configure("signing_secret", "whsec_" + os.urandom(8).hex())
    slack = SlackReceiver().start()
    slack.configure("slow_seconds", args.slow_seconds)
    for receiver in (hooks, slack):
        receiver.httpd.handle_error = quiet
    secret = os.urandom(16).hex()
    platform = BenchPlatform(env=env, workers=args.workers, concurrency=args.concurrency)
    platform.env["CELERY_QUEUE"] = os.environ.get("BENCH_QUEUE", f"agentplatform-bench-chaos{slot}")
    platform.env["CELERY_OUTBOX_QUEUE"] = platform.env["CELERY_QUEUE"] + "-outbox"
    broker = redis.Redis.from_url(platform.env["CELERY_BROKER_URL"])
    kills = flushes = pg_restarts = 0
    with platform:
        with platform.tenant("chaos"):
            credential_set(connector="webhook", secrets={"signing_secret": hooks.signing_secret,
                                                         "url": f"{hooks.url}/hook"})
            credential_set(connector="slack", secrets={"token": SLACK_TOKEN,
                                                       "api_url": f"{slack.url}/api"})
        tenant = Tenant.objects.get(schema_name="chaos")
        connection = slack_connection_create(tenant=tenant, team_id="TCHAOS",
                                             signing_secret=secret)
        web = WebServer(args.port or 18865 + slot, platform.env, platform.logs / "runserver.log")
        try:
            web.wait_ready(platform.wait_for)
            events = SlackEvents(web, connection, secret)
            with tenant_context(tenant):
                inputs = {}
                for i in range(args.runs):
                    slow = args.slow_every and i % args.slow_every == 0
                    run_input = {"steps": args.steps, "seconds": args.step_seconds,
                                 "notify": SLOW_CHANNEL if slow else NOTE_CHANNEL}
                    if args.wait_every and i % args.wait_every == args.wait_every - 1:
                        run_input["channel"] = f"CW{i}"
                    inputs[run_start(agent="bench_chaos", input=run_input).run.id] = run_input
                print(f"started {args.runs} runs ({sum('channel' in i for i in inputs.values())} "
                      f"wait for a Slack event); {args.workers} workers x {args.concurrency}")
                begin = time.monotonic()
                deadline = begin + args.deadline
                # Faults, spread over the kills: the flush after a third, the restart at 2/3.
                flush_at = None if args.no_broker_flush else max(1, args.kills // 3)
                restart_at = None if args.no_pg_restart else max(1, 2 * args.kills // 3)
                next_kill, next_report = begin + args.kill_every, begin + 30
                while time.monotonic() < deadline:
                    waiting = db_retry(lambda: list(Run.objects.filter(
                        id__in=list(inputs), status="waiting",
                        gates__status="open", gates__kind="slack.message")
                        .values_list("input__channel", flat=True)), what="waiting runs")
                    events.send_due([c for c in waiting if c])
                    if kills < args.kills and time.monotonic() >= next_kill:
                        kills += worker_kill(platform, inputs)
                        next_kill = time.monotonic() + args.kill_every
                        if kills == flush_at:
                            broker.flushdb()
                            flushes += 1
                            print(f"broker FLUSHDB ({platform.env['CELERY_BROKER_URL']})")
                        if kills == restart_at:
                            started = time.monotonic()
                            postgres_restart()
                            pg_restarts += 1
                            print(f"PostgreSQL restarted ({time.monotonic() - started:.1f}s)")
                    if time.monotonic() >= next_report:
                        next_report += 30
                        progress(inputs, begin)
                    if kills >= args.kills and settled(inputs):
                        break
                    time.sleep(0.25)
                elapsed = time.monotonic() - begin
                # Deliveries in flight (the slow receiver) land before the count.
                time.sleep(args.slow_seconds + 1)
                statuses = db_retry(lambda: dict(Run.objects.filter(id__in=list(inputs))
                                                 .values_list("id", "status")), what="statuses")
                for_person = db_retry(lambda: set(Run.objects.filter(
                    id__in=list(inputs), status="waiting", approvals__status="pending")
                    .values_list("id", flat=True)), what="parked runs")
        finally:
            web.stop()
    hooks_seen, slack_seen = hooks.keys_by_logical(), slack.posts_by_logical(FAST_CHANNEL)
    slow_seen = slack.posts_by_logical(SLOW_CHANNEL)
    notes_seen = slow_seen + slack.posts_by_logical(NOTE_CHANNEL)
    counts, lost = chaos_count(inputs=inputs, statuses=statuses, hooks_seen=hooks_seen,
                               slack_seen=slack_seen, notes_seen=notes_seen,
                               accepted=set(events.accepted))
    outcome = Counter(statuses.values())
    print(f"ran {elapsed:.0f}s: runs succeeded={outcome['succeeded']} "
          f"parked_for_person={len(for_person)} "
          f"waiting_otherwise={outcome['waiting'] - len(for_person)} "
          f"queued_or_running={outcome['queued'] + outcome['running']} "
          f"failed={outcome['failed']} cancelled={outcome['cancelled']}")
    print(f"receivers: webhook deliveries={len(hooks.deliveries)} for {len(hooks_seen)} messages; "
          f"slack posts={len(slack.messages.get(FAST_CHANNEL, []))} for {len(slack_seen)}; "
          f"notifications delivered={sum(notes_seen.values())} for {len(notes_seen)} "
          f"(slow receiver {sum(slow_seen.values())} for {len(slow_seen)}); "
          f"lost by receiver webhook={lost['webhook']} slack={lost['slack']} "
          f"notes={lost['notes']}")
    print(f"slack events: answered 200={len(events.accepted)} "
          f"of {sum('channel' in i for i in inputs.values())} waiting runs, "
          f"requests={sum(events.tries.values())}")
    print(f"chaos: runs={args.runs} kills={kills} broker_flushes={flushes} "
          f"pg_restarts={pg_restarts} " + " ".join(f"{k}={v}" for k, v in counts.items()))
    hooks.stop()
    slack.stop()
    return 0 if not any(counts.values()) else 1


def chaos_count(*, inputs: dict, statuses: dict, hooks_seen: dict[str, set[str]],
                slack_seen: Counter, notes_seen: Counter, accepted: set[str]
                ) -> tuple[dict[str, int], Counter]:
    """The closing counts from what the receivers saw (logical id -> keys, or -> deliveries),
    the runs' final statuses and the event channels answered 200; and lost, by receiver."""
    lost = Counter()
    for run_id, run_input in inputs.items():
        if statuses.get(run_id) != "succeeded":
            continue
        expected = expected_messages(run_id, run_input)
        lost["webhook"] += sum(m not in hooks_seen for m in expected["webhook"])
        lost["slack"] += sum(m not in slack_seen for m in expected["slack"])
        lost["notes"] += sum(m not in notes_seen for m in expected["notes"])
    run_of = {run_input["channel"]: run_id for run_id, run_input in inputs.items()
              if run_input.get("channel")}
    counts = {
        "lost_effects": sum(lost.values()),
        # The webhook receiver deduplicates by key: a second key is the duplicate. Slack
        # cannot: every post after the first is one.
        "duplicate_effects": (sum(len(keys) - 1 for keys in hooks_seen.values())
                              + sum(n - 1 for n in slack_seen.values())),
        "outbox_double_sends": sum(n - 1 for n in notes_seen.values()),
        "lost_wakeups": sum(f"{run_of[c]}/woken/hook" not in hooks_seen for c in accepted),
        "stuck_runs": sum(statuses.get(run_id) != "succeeded" for run_id in inputs),
    }
    return counts, lost


def worker_kill(platform, inputs: dict) -> int:
    """kill -9 a worker's whole process group, preferring one that holds a run mid-step, and
    start its replacement. Returns 1 when a worker was killed."""
    from runs.models import Run

    owners = db_retry(lambda: list(Run.objects.filter(id__in=list(inputs), status="running")
                                   .exclude(lease_owner="").values_list("lease_owner", flat=True)),
                      what="running runs")
    busy = [w for w in (platform.worker_of(int(o.rsplit(":", 1)[1])) for o in owners) if w]
    victim = random.choice(busy or platform.workers)
    victim.kill(signal.SIGKILL)
    print(f"kill -9 worker {victim.name} ({'mid-step' if busy else 'holding no run'})")
    platform.replace(victim)
    return 1


def progress(inputs: dict, begin: float) -> None:
    from runs.models import Run

    done = db_retry(lambda: Run.objects.filter(id__in=list(inputs), status="succeeded").count(),
                    what="progress")
    print(f"  {time.monotonic() - begin:4.0f}s: {done} runs succeeded")


def settled(inputs: dict) -> bool:
    """Every run ended or parked for a person, and no notification is still due."""
    from runs.effects.models import OutboxMessage
    from runs.models import Run

    def read():
        moving = Run.objects.filter(id__in=list(inputs), status__in=["queued", "running"])
        waiting_for_event = Run.objects.filter(id__in=list(inputs), status="waiting") \
            .exclude(approvals__status="pending")
        outbox_due = OutboxMessage.objects.filter(status__in=["pending", "sending"])
        return not moving.exists() and not waiting_for_event.exists() and not outbox_due.exists()

    return db_retry(read, what="settled")
