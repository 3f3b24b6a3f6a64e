"""`python -m bench partition`: worker hosts in network namespaces of their own; one host's link
is cut mid-step, its runs must be taken over by the others, and when the link comes back every
write it still attempts must be refused by fencing.

Each host is a network namespace (`ip netns`) joined to this machine by a veth pair, with a
hostname of its own (`unshare --uts`, so its lease owners read `<host>:<pid>`) and an
/etc/hosts of its own (`/etc/netns/<ns>/hosts`) in which `apgw` is its end of the link. It runs
a run worker and an outbox worker, which reach PostgreSQL, Redis and the receiver only through
`apgw`: TCP forwarders in this process listen on each host's gateway address and pass bytes to
the loopback services. Beat, which dispatches and re-queues runs whose lease expired, runs here,
outside the hosts. The cut is `ip link set <veth> down` on this side: no reset, no FIN, the
host's connections simply stop answering (a partition), until `ip link set up`.

Each run of `bench_partition` takes `--steps` visits of its step `work`: sleep, one ledger
effect to the webhook receiver (deduplicates by Idempotency-Key), an outbox notification to a
slow path of the same receiver, sleep. The cut comes while the victim host's steps sleep, so
when its link returns its processes try to checkpoint, start an effect, record an outbox
delivery or beat. The engine logs each write refused by fencing ("fenced write refused
(<write>)", agentplatform.lease.fenced_writes_refused); the bench counts those lines in the
victim host's logs.

Whether any such write got through is read from the database, not from the workers: triggers
(this bench's database only) note, for every checkpoint, effect start or attempt and outbox
update, the writing host (its connections' application_name) and the run's lease at that
moment. A checkpoint whose state's epoch (the step writes `ctx.epoch` into it) is not the run's
epoch, an effect started by a host that does not hold the run's lease, or an outbox outcome
written by a host over another's claim is a zombie write accepted.

Ends with one line:
`partition: hosts=<n> cut=<n> takeover_max_s=<s> lease_ttl=<s> zombie_writes_refused=<n>
zombie_writes_accepted=<n> duplicate_effects=<n> lost_runs=<n>`
and exits 1 unless takeover_max_s <= 2 x lease_ttl, zombie_writes_refused > 0 and the last
three are 0. Needs root (ip netns); namespaces, links and processes are removed on exit.
"""

import argparse
import asyncio
import json
import os
import random
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from bench.database import slot_environment
from runs.agents import Agent
from runs.transitions import finish, goto
from tests.support.fakes.webhook import FakeWebhook

OWN_DJANGO_SETUP = True  # it picks its own database, Redis db and queue (by slot)
GATEWAY = "apgw"  # a host's name for its end of the link, in its own /etc/hosts
REFUSED = re.compile(r"fenced write refused \((\w+)\)")

partition_agent = Agent("bench_partition", version=1)


@partition_agent.step(start=True, next=["work"])
def work(ctx, state):
    n = state.get("n", 0) + 1
    where = f"{ctx.run_id}/work{n}"
    # the first visit staggers the runs, so the cut finds a host's runs at different points
    time.sleep(state["before"] + (state["offset"] if n == 1 else 0))  # cut here: effect start
    ctx.effect("hook", "webhook", payload={"logical": f"{where}/hook"})
    ctx.notify(f"note{n}", "webhook", url=state["slow_url"], payload={"logical": f"{where}/note"})
    time.sleep(state["after"])  # cut here: the checkpoint is refused
    update = {"n": n, "epoch": ctx.epoch}  # who wrote the checkpoint, for the count
    if n < state["steps"]:
        return goto("work", update=update)
    return finish(n, update=update)


class Receiver(FakeWebhook):
    """The webhook receiver (deduplicates by key); `/slow` answers `slow_seconds` late, so an
    outbox deliverer is mid-call when its host is cut."""

    configurable = (*FakeWebhook.configurable, "slow_seconds")

    def reset(self) -> None:
        super().reset()
        with self.lock:
            self.slow_seconds = getattr(self, "slow_seconds", 1.5)

    def handle(self, method, path, query, headers, raw):
        answer = super().handle(method, path, query, headers, raw)
        if path.startswith("/slow"):
            time.sleep(self.slow_seconds)
        return answer

    def keys_by_logical(self) -> dict[str, set[str]]:
        with self.lock:
            keys: dict[str, set[str]] = defaultdict(set)
            for delivery in self.deliveries:
                try:
                    keys[json.loads(delivery["body"])["logical"]].add(delivery["key"])
                except (ValueError, KeyError, TypeError):
                    keys["<unreadable>"].add(delivery["key"])
            return keys


# -- the hosts' network --------------------------------------------------------------------------

@dataclass
class Host:
    name: str  # its hostname and its connections' application_name
    netns: str
    veth: str  # this side of the link: the one cut
    gateway: str  # this side's address, `apgw` on the host
    workers: list = field(default_factory=list)

    @property
    def prefix(self) -> list[str]:
        """Run a command on the host: its network, its hostname."""
        return ["ip", "netns", "exec", self.netns, "unshare", "--uts", "sh", "-c",
                'hostname "$0" && exec "$@"', self.name]


def ip(*args: str, check: bool = True) -> None:
    subprocess.run(["ip", *args], check=check, capture_output=True, timeout=30)


def netns_available() -> str:
    """Why hosts cannot be made here, or "" if they can."""
    if os.geteuid() != 0:
        return "needs root (ip netns, veth)"
    for tool in ("ip", "unshare", "hostname"):
        if shutil.which(tool) is None:
            return f"needs {tool!r} (Debian: iproute2, util-linux, hostname)"
    probe = f"approbe{os.getpid() % 100000}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    ip("netns", "del", probe, check=False)
    return ""


def hosts_make(slot: int, count: int) -> list[Host]:
    """Namespaces `ap-s<slot>-h<i>`, each linked to this machine by a /30 of its own."""
    hosts = []
    for i in range(1, count + 1):
        host = Host(name=f"partition-h{i}", netns=f"ap-s{slot}-h{i}", veth=f"aps{slot}h{i}",
                    gateway=f"10.{100 + slot % 100}.{i}.1")
        hosts_remove([host])  # what a killed earlier run of this slot left
        inside = f"{host.veth}n"
        ip("netns", "add", host.netns)
        ip("link", "add", host.veth, "type", "veth", "peer", "name", inside)
        ip("link", "set", inside, "netns", host.netns)
        ip("addr", "add", f"{host.gateway}/30", "dev", host.veth)
        ip("link", "set", host.veth, "up")
        ip("netns", "exec", host.netns, "ip", "addr", "add",
           f"10.{100 + slot % 100}.{i}.2/30", "dev", inside)
        ip("netns", "exec", host.netns, "ip", "link", "set", inside, "up")
        ip("netns", "exec", host.netns, "ip", "link", "set", "lo", "up")
        etc = Path("/etc/netns") / host.netns
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "hosts").write_text(f"127.0.0.1 localhost\n127.0.1.1 {host.name}\n"
                                   f"{host.gateway} {GATEWAY}\n")
        hosts.append(host)
    return hosts


def hosts_remove(hosts: list[Host]) -> None:
    """Deleting a namespace deletes its end of the veth, and with it ours."""
    for host in hosts:
        ip("netns", "del", host.netns, check=False)
        ip("link", "del", host.veth, check=False)
        shutil.rmtree(Path("/etc/netns") / host.netns, ignore_errors=True)


def link_cut(host: Host) -> None:
    ip("link", "set", host.veth, "down")


def link_restore(host: Host) -> None:
    ip("link", "set", host.veth, "up")


class Forwarder:
    """TCP forwarders from each host's gateway address to services on this machine's loopback
    (PostgreSQL, Redis and the receiver listen there only), in one asyncio loop on a thread. No
    timeouts: across a cut, a connection just waits, as it would across a real partition."""

    def __init__(self, routes: list[tuple[str, int]]):
        self.routes = routes  # (listen address, port): forwarded to 127.0.0.1:port
        self.loop = asyncio.new_event_loop()
        self.servers: list = []
        self.thread = threading.Thread(target=self.loop.run_forever, name="forwarder",
                                       daemon=True)

    def start(self) -> "Forwarder":
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), self.loop).result(timeout=10)
        return self

    async def _listen(self) -> None:
        for address, port in self.routes:
            self.servers.append(await asyncio.start_server(
                lambda r, w, port=port: self._connection(r, w, port), address, port))

    async def _connection(self, reader, writer, port: int) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(self._pipe(reader, upstream_writer),
                             self._pipe(upstream_reader, writer))

    @staticmethod
    async def _pipe(reader, writer) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    def stop(self) -> None:
        async def close():
            for server in self.servers:
                server.close()

        if self.thread.is_alive():
            asyncio.run_coroutine_threadsafe(close(), self.loop).result(timeout=10)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=10)


# -- who wrote what, under whose lease (this bench's database only) ------------------------------

def writes_audit_install(schema: str) -> None:
    """Triggers that note each fenced write with the writing host and the run's lease then."""
    from django.db import connection

    from runs.effects.models import Effect, OutboxMessage
    from runs.models import Checkpoint, Run

    runs = f'"{schema}".{Run._meta.db_table}'
    with connection.cursor() as cursor:
        cursor.execute(f"""
            CREATE TABLE IF NOT EXISTS public.bench_partition_writes (
                id bigserial PRIMARY KEY, tbl text, op text, run_id uuid, writer text,
                run_owner text, run_epoch bigint, state_epoch bigint, claimed_by text,
                status text, at timestamptz DEFAULT clock_timestamp());
            CREATE OR REPLACE FUNCTION public.bench_partition_write() RETURNS trigger
            LANGUAGE plpgsql AS $$
            DECLARE owner text; epoch bigint;
            BEGIN
              IF TG_TABLE_NAME = '{OutboxMessage._meta.db_table}' THEN
                IF OLD.status = 'sending' AND OLD.claimed_by <> '' THEN
                  INSERT INTO public.bench_partition_writes
                         (tbl, op, run_id, writer, claimed_by, status)
                  VALUES ('outbox', TG_OP, NEW.run_id, current_setting('application_name'),
                          OLD.claimed_by || ' -> ' || NEW.claimed_by, NEW.status);
                END IF;
                RETURN NULL;
              END IF;
              SELECT lease_owner, lease_epoch INTO owner, epoch FROM {runs} WHERE id = NEW.run_id;
              IF TG_TABLE_NAME = '{Checkpoint._meta.db_table}' THEN
                INSERT INTO public.bench_partition_writes
                       (tbl, op, run_id, writer, run_owner, run_epoch, state_epoch)
                VALUES ('checkpoint', TG_OP, NEW.run_id, current_setting('application_name'),
                        owner, epoch, (NEW.state->>'epoch')::bigint);
              ELSIF TG_OP = 'INSERT' OR NEW.attempts > OLD.attempts THEN
                INSERT INTO public.bench_partition_writes
                       (tbl, op, run_id, writer, run_owner, run_epoch)
                VALUES ('effect', TG_OP, NEW.run_id, current_setting('application_name'),
                        owner, epoch);
              END IF;
              RETURN NULL;
            END $$;
            CREATE TRIGGER bench_partition_checkpoint AFTER INSERT
                ON "{schema}".{Checkpoint._meta.db_table}
                FOR EACH ROW EXECUTE FUNCTION public.bench_partition_write();
            CREATE TRIGGER bench_partition_effect AFTER INSERT OR UPDATE
                ON "{schema}".{Effect._meta.db_table}
                FOR EACH ROW EXECUTE FUNCTION public.bench_partition_write();
            CREATE TRIGGER bench_partition_outbox AFTER UPDATE
                ON "{schema}".{OutboxMessage._meta.db_table}
                FOR EACH ROW EXECUTE FUNCTION public.bench_partition_write();
        """)


def host_of(owner: str) -> str:
    """`<host>:<pid>` -> host ("" for no owner)."""
    return owner.rsplit(":", 1)[0] if owner else ""


def zombie_writes(rows: list[dict], hosts: set[str]) -> list[dict]:
    """The fenced writes that got through although the writer did not hold the lease (or the
    outbox claim) they were made under. `rows`: bench_partition_writes; only the hosts' own
    writes are judged (the bench process starts runs without a lease)."""
    accepted = []
    for row in rows:
        if row["writer"] not in hosts:
            continue
        if row["tbl"] == "checkpoint":
            bad = row["state_epoch"] is not None and row["state_epoch"] != row["run_epoch"]
        elif row["tbl"] == "effect":
            bad = host_of(row["run_owner"] or "") != row["writer"]
        else:  # outbox: a host wrote over a live claim that was neither its old nor its new one
            before, _, after = (row["claimed_by"] or "").partition(" -> ")
            bad = row["writer"] not in (host_of(before), host_of(after))
        if bad:
            accepted.append(row)
    return accepted


def refusals_count(logs: list[Path]) -> Counter:
    """"fenced write refused (<write>)" lines, by write."""
    found = Counter()
    for log in logs:
        if log.exists():
            found.update(REFUSED.findall(log.read_text(errors="replace")))
    return found


def duplicates_count(keys_by_logical: dict[str, set[str]]) -> int:
    """The receiver deduplicates by key: the same logical message under a second key is one."""
    return sum(len(keys) - 1 for keys in keys_by_logical.values())


def lost_runs_count(*, runs: dict, steps: int) -> int:
    """Runs that did not succeed with the result every step counted to. `runs`: id ->
    (status, result)."""
    return sum(status != "succeeded" or result != steps for status, result in runs.values())


# -- the bench -----------------------------------------------------------------------------------



def through_gateway(url: str) -> str:
    """The same service as a host reaches it: `apgw` instead of the loopback address."""
    return url.replace("127.0.0.1", GATEWAY).replace("localhost", GATEWAY)


class Fleet:
    """Beat here; on each host a run worker and an outbox worker."""

    def __init__(self, *, hosts: list[Host], env: dict, concurrency: int, log_dir: Path):
        self.hosts, self.env, self.concurrency, self.logs = hosts, env, concurrency, log_dir
        self.ttl = float(env["RUN_LEASE_SECONDS"])
        self.beat = None

    def start(self) -> None:
        from agentplatform import localprocs

        self.beat = localprocs.Beat(self.logs.parent, log_dir=self.logs, env=self.env)
        for host in self.hosts:
            env = {**self.env, "PGAPPNAME": host.name, "PGCONNECT_TIMEOUT": "5",
                   # A transaction the cut leaves open would hold its run's row, and so the
                   # claim that takes the run over, as long as the server keeps the connection.
                   "PGOPTIONS": f"-c idle_in_transaction_session_timeout={int(self.ttl * 1000)}",
                   "BENCH_DATABASE_URL": through_gateway(os.environ["BENCH_DATABASE_URL"]),
                   "CELERY_BROKER_URL": through_gateway(self.env["CELERY_BROKER_URL"])}
            host.workers = [
                localprocs.Worker(f"{host.name}-run", self.concurrency, log_dir=self.logs,
                                  env=env, prefix=host.prefix),
                localprocs.Worker.outbox(f"{host.name}-outbox", 2, log_dir=self.logs, env=env,
                                         prefix=host.prefix)]
        for host in self.hosts:
            for worker in host.workers:
                worker.wait_ready(timeout=90)

    def stop(self) -> None:
        for process in [w for host in self.hosts for w in host.workers] + [self.beat]:
            if process is not None:
                process.stop()


def terminated(signum, frame):
    raise SystemExit(128 + signum)  # so the namespaces and processes are removed


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench partition")
    parser.add_argument("--hosts", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=3, help="run slots per host")
    parser.add_argument("--runs", type=int, default=0,
                        help="runs (default: the slots of all hosts but one, so the others "
                             "can take the cut host's runs at once)")
    parser.add_argument("--steps", type=int, default=8, help="visits of `work` per run")
    parser.add_argument("--step-seconds", type=float, default=3.0,
                        help="each visit sleeps this long, half before its effect, half after")
    parser.add_argument("--lease-ttl", type=float, default=3.0)
    parser.add_argument("--slow-seconds", type=float, default=1.5,
                        help="how late the receiver answers a notification")
    parser.add_argument("--cuts", type=int, default=1, help="hosts cut, one after the other")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.cuts >= args.hosts:
        parser.error("--cuts must leave at least one host")
    args.runs = args.runs or (args.hosts - 1) * args.concurrency
    why = netns_available()
    if why:
        print(f"partition: cannot make hosts here: {why}")
        return 2
    random.seed(args.seed)
    slot = slot_environment("partition")  # with chaos's Redis db, under queues of its own
    os.environ.pop("BENCH_POOLER_URL", None)  # the hosts reach PostgreSQL itself, by their link
    ttl = args.lease_ttl
    env = {"AGENT_MODULES": "agents,bench.partition",
           "CONNECTOR_ALLOW_PRIVATE_DESTINATIONS": "true",
           "CONNECTOR_TIMEOUT_SECONDS": str(2 * args.slow_seconds + 1),
           "OUTBOX_CLAIM_SECONDS": str(2 * args.slow_seconds + 2),
           "OUTBOX_SWEEP_SECONDS": "0.5", "OUTBOX_BACKOFF_SECONDS": "0.5",
           "RUN_LEASE_SECONDS": str(ttl), "RUN_HEARTBEAT_SECONDS": str(ttl / 4),
           "DISPATCH_CHECK_AFTER_SECONDS": str(ttl / 4), "DISPATCH_TICK_SECONDS": "0.25",
           "RUN_SLICE_SECONDS": "60",  # a run stays on its host: the cut finds leases held
           "DISPATCH_MAX_IN_FLIGHT": str(args.hosts * args.concurrency),
           "RUN_TENANT_MAX_IN_FLIGHT": str(args.hosts * args.concurrency)}
    os.environ.update(env)
    import django

    django.setup()
    from django.conf import settings

    from bench.database import bench_database_prepare

    settings.RUN_LEASE_SECONDS = ttl
    env["CELERY_BROKER_URL"] = os.environ["BENCH_REDIS_URL"]
    env["CELERY_QUEUE"] = os.environ.get("BENCH_QUEUE", f"agentplatform-bench-partition{slot}")
    env["CELERY_OUTBOX_QUEUE"] = env["CELERY_QUEUE"] + "-outbox"
    os.environ.update(env)
    settings.CELERY_BROKER_URL = env["CELERY_BROKER_URL"]
    settings.CELERY_TASK_DEFAULT_QUEUE = env["CELERY_QUEUE"]
    settings.CELERY_OUTBOX_QUEUE = env["CELERY_OUTBOX_QUEUE"]
    settings.DISPATCH_MAX_IN_FLIGHT = settings.RUN_TENANT_MAX_IN_FLIGHT = args.hosts * args.concurrency
    from agentplatform.celery import app

    app.conf.broker_url = env["CELERY_BROKER_URL"]
    app.conf.task_default_queue = env["CELERY_QUEUE"]

    workdir = Path(tempfile.mkdtemp(prefix="bench-partition-"))
    hosts: list[Host] = []
    forwarder = receiver = fleet = None
    previous_term = signal.signal(signal.SIGTERM, terminated)
    try:
        import redis

        broker = redis.Redis.from_url(env["CELERY_BROKER_URL"])
        broker.delete(env["CELERY_QUEUE"], env["CELERY_OUTBOX_QUEUE"])
        bench_database_prepare()
        receiver = Receiver().start()
        receiver.configure("signing_secret", "whsec_" + os.urandom(8).hex())
        receiver.configure("slow_seconds", args.slow_seconds)
        receiver.httpd.handle_error = lambda *_: None  # a cut mid-request breaks its pipe
        hosts = hosts_make(slot, args.hosts)
        ports = [settings.DATABASES["default"]["PORT"] or 5432,
                 redis.Redis.from_url(env["CELERY_BROKER_URL"]).connection_pool
                 .connection_kwargs.get("port", 6379), receiver.port]
        forwarder = Forwarder([(h.gateway, int(p)) for h in hosts for p in ports]).start()
        fleet = Fleet(hosts=hosts, env=env, concurrency=args.concurrency,
                      log_dir=workdir / "logs")
        outcome = bench_run(args, hosts=hosts, fleet=fleet, receiver=receiver, ttl=ttl)
    finally:
        signal.signal(signal.SIGTERM, previous_term)
        for host in hosts:  # a cut host's workers stop faster with their link back
            ip("link", "set", host.veth, "up", check=False)
        if fleet is not None:
            fleet.stop()
        if forwarder is not None:
            forwarder.stop()
        if receiver is not None:
            receiver.stop()
        hosts_remove(hosts)
        from django.db import connections

        connections.close_all()
        print(f"(process logs in {workdir / 'logs'})")
    return outcome


def bench_run(args, *, hosts: list[Host], fleet: Fleet, receiver: Receiver, ttl: float) -> int:
    from django.db import connection
    from django_tenants.utils import tenant_context

    from integrations.services import credential_set
    from runs.effects.models import OutboxMessage
    from runs.models import Run
    from runs.services import run_start
    from tenants.services import tenant_create

    tenant = tenant_create(schema_name="partition").tenant
    writes_audit_install(tenant.schema_name)
    with tenant_context(tenant):
        credential_set(connector="webhook", secrets={
            "signing_secret": receiver.signing_secret,
            "url": f"http://{GATEWAY}:{receiver.port}/hook"})
    started = time.monotonic()
    fleet.start()
    print(f"{len(hosts)} hosts x {args.concurrency} run slots (+ an outbox worker each) ready "
          f"in {time.monotonic() - started:.0f}s; lease TTL {ttl:g}s")
    half = args.step_seconds / 2
    with tenant_context(tenant):
        runs = [run_start(agent="bench_partition", input={
            "steps": args.steps, "before": half, "after": half,
            "offset": round(i * args.step_seconds / args.runs, 2),
            "slow_url": f"http://{GATEWAY}:{receiver.port}/slow"}).run.id
            for i in range(args.runs)]
        takeovers: list[float] = []
        cut_hosts: list[Host] = []
        victims = set(host.name for host in hosts)
        for _ in range(args.cuts):
            host = cut_choose(runs, [h for h in hosts if h.name in victims])
            victims.discard(host.name)
            time.sleep(random.uniform(0, args.step_seconds))  # anywhere in its steps
            takeovers += cut_and_restore(host, runs=runs, ttl=ttl, step_seconds=args.step_seconds)
            cut_hosts.append(host)
        deadline = time.monotonic() + 60 + 3 * args.steps * args.step_seconds
        while time.monotonic() < deadline and (
                Run.objects.filter(id__in=runs, status__in=["queued", "running"]).exists()
                or OutboxMessage.objects.filter(status__in=["pending", "sending"]).exists()):
            time.sleep(0.25)
        # The cut hosts' writes still in flight (TCP retries back off): until their count holds.
        logs = [w.log_path for h in cut_hosts for w in h.workers]
        settle = time.monotonic() + 60
        count, still_since = refusals_count(logs), time.monotonic()
        while time.monotonic() < settle and time.monotonic() - still_since < 5:
            time.sleep(0.5)
            now = refusals_count(logs)
            if now != count:
                count, still_since = now, time.monotonic()
        final = {run_id: (status, result) for run_id, status, result in
                 Run.objects.filter(id__in=runs).values_list("id", "status", "result")}
    with connection.cursor() as cursor:
        cursor.execute("SELECT tbl, op, run_id, writer, run_owner, run_epoch, state_epoch, "
                       "claimed_by, status FROM public.bench_partition_writes ORDER BY id")
        columns = [c.name for c in cursor.description]
        rows = [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]
    accepted = zombie_writes(rows, {h.name for h in hosts})
    for row in accepted[:10]:
        print(f"  ACCEPTED zombie write: {row}")
    refused = refusals_count(logs)
    everywhere = refusals_count([w.log_path for h in hosts for w in h.workers])
    keys = receiver.keys_by_logical()
    expected = {f"{run_id}/work{n}/{what}" for run_id in runs for n in range(1, args.steps + 1)
                for what in ("hook", "note")}
    counted = Counter(row["tbl"] for row in rows if row["writer"] in {h.name for h in hosts})
    print(f"writes audited: {dict(counted)}; refused by fencing on the cut hosts: "
          f"{dict(refused)} (all hosts: {sum(everywhere.values())})")
    print(f"receiver: deliveries={len(receiver.deliveries)} for {len(keys)} messages "
          f"(expected {len(expected)}, missing {len(expected - set(keys))}); runs: "
          f"{dict(Counter(status for status, _ in final.values()))}")
    takeover_max = max(takeovers) if takeovers else float("nan")
    counts = {"zombie_writes_refused": sum(refused.values()),
              "zombie_writes_accepted": len(accepted),
              "duplicate_effects": duplicates_count(keys),
              "lost_runs": lost_runs_count(runs=final, steps=args.steps)}
    print(f"partition: hosts={len(hosts)} cut={len(cut_hosts)} "
          f"takeover_max_s={takeover_max:.2f} lease_ttl={ttl:g} "
          + " ".join(f"{k}={v}" for k, v in counts.items()))
    met = (takeover_max <= 2 * ttl and counts["zombie_writes_refused"] > 0
           and not any(v for k, v in counts.items() if k != "zombie_writes_refused"))
    return 0 if met else 1


def cut_choose(runs: list, candidates: list[Host]) -> Host:
    """The candidate host holding the most runs mid-step, once every run has taken a step."""
    from runs.models import Checkpoint, Run

    def ready():
        stepped = (Checkpoint.objects.filter(run_id__in=runs, visit__gte=1)
                   .values("run_id").distinct().count())
        owners = Counter(host_of(o) for o in Run.objects.filter(
            id__in=runs, status="running").values_list("lease_owner", flat=True))
        best = max(candidates, key=lambda h: owners[h.name])
        return best if stepped == len(runs) and owners[best.name] else None

    from agentplatform.localprocs import wait_for

    return wait_for(ready, timeout=120, interval=0.1, what="every run to have taken a step")


def cut_and_restore(host: Host, *, runs: list, ttl: float, step_seconds: float) -> list[float]:
    """Cut the host's link; time until each run it held is claimed by another host (its epoch
    moves on) and each outbox claim it held is taken over; then give the link back."""
    from runs.effects.models import OutboxMessage
    from runs.models import Run

    cut_at = time.monotonic()
    link_cut(host)
    time.sleep(0.1)  # statements in flight at the cut have landed (or will only after it)
    held = {run_id: epoch for run_id, owner, epoch in Run.objects.filter(
        id__in=runs, status="running").values_list("id", "lease_owner", "lease_epoch")
        if host_of(owner) == host.name}
    claims = {m.id: m.attempts for m in OutboxMessage.objects.filter(
        status="sending", claimed_by__startswith=f"{host.name}:")}
    print(f"cut {host.name} ({host.veth} down): it held {len(held)} runs and "
          f"{len(claims)} outbox claims")
    taken: dict = {}
    deadline = cut_at + max(30.0, 10 * ttl)
    while time.monotonic() < deadline and len(taken) < len(held):
        for run_id, epoch in Run.objects.filter(id__in=list(held)).values_list("id", "lease_epoch"):
            if run_id not in taken and epoch > held[run_id]:
                taken[run_id] = time.monotonic() - cut_at
        time.sleep(0.02)
    while time.monotonic() < deadline and OutboxMessage.objects.filter(
            id__in=list(claims), status="sending", claimed_by__startswith=f"{host.name}:").exists():
        time.sleep(0.05)
    # Keep it cut a step longer: its steps' sleeps end and their writes wait on the link.
    time.sleep(max(0.0, step_seconds - (time.monotonic() - cut_at)))
    link_restore(host)
    for run_id in held:
        print(f"  run {run_id}: " + (f"taken over after {taken[run_id]:.2f}s" if run_id in taken
                                     else "NOT taken over while cut"))
    print(f"link of {host.name} back after {time.monotonic() - cut_at:.1f}s")
    return [taken.get(run_id, float("inf")) for run_id in held]
