"""`python -m bench tenants`: the periodic work of the platform with 10 tenants, then with 2,000.

Runs in its own database (agentplatform_bench_tenants, suffixed by BENCH_SLOT, else TEST_SLOT;
dropped and made anew here), its Celery messages on a queue of its own that nobody consumes
(removed at the end). Measured:

- creating a tenant the production way (`tenant_create`: schema, every migration, data key and
  API key), p50 of the first `--base` tenants;
- the other tenants are made in bulk from the first one, the reference: its schema's DDL and
  migration records (pg_dump) replayed under each new name, several schemas per transaction,
  two connections at once. That is a fixture, not how a tenant signs up: each one by
  `tenant_create` would take an hour for 2,000 here. Bulk tenants get no keys;
- `migrate_schemas --tenant --executor=multiprocessing` over all of them (nothing to apply:
  what every deploy pays), with TENANT_MULTIPROCESSING_MAX_PROCESSES = the CPU count;
- with one queued run of one tenant handed out an hour ago and never claimed (the watchdog
  puts it back), one stale due timer (fired: stale) and one due outbox message (rung each
  sweep: nobody delivers it), the fastest of `--reps` rounds: the dispatcher's tick (`dispatch.tick`:
  watchdog, timers, dispatch), and alone the outbox sweep, the timer sweep and the watchdog.
  Every bulk tenant has a parked timer and an outbox retry due tomorrow, so the public indexes
  hold a row per tenant;
- for comparison, the outbox sweep as it was before the due-index (each schema visited);
- a worker process's RSS after it touched `--touch` tenants (a run, approval and outbox query
  and the outbox deliverer's task in each, as tasks with a schema header do).

Ends with one line:
`tenants: count=<n> create_p50_ms=<ms> migrate_all_s=<s> tick_ms_10=<ms> tick_ms_max=<ms>
tick_growth=<ratio> sweep_growth=<ratio> worker_rss_mb=<mb>`
(sweep_growth: the largest growth of the three sweeps). Exits 1 unless both growths are <= 1.5.
"""

import argparse
import concurrent.futures
import gc
import json
import os
import re
import statistics
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from uuid import UUID

SLOT = os.environ.get("BENCH_SLOT", os.environ.get("TEST_SLOT", ""))
DATABASE = f"agentplatform_bench_tenants{SLOT}"  # engineers sharing the server: one each
OWN_DJANGO_SETUP = True  # the database is chosen from the arguments first
# The one ready run, due timer and due outbox message: in the reference tenant, after its dump.
FIXTURE = "t0000"
GOAL = 1.5
SCHEMAS_PER_TRANSACTION = 10
ROOT = Path(__file__).resolve().parents[2]


def schema(i: int) -> str:
    return f"t{i:04d}"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench tenants")
    parser.add_argument("--count", type=int, default=2000, help="tenants at the end")
    parser.add_argument("--base", type=int, default=10, help="tenants first (made one by one)")
    parser.add_argument("--reps", type=int, default=40, help="measurements per cost and size")
    parser.add_argument("--touch", type=int, default=500, help="tenants a worker touches")
    parser.add_argument("--quick", action="store_true", help="200 tenants, fewer repetitions")
    parser.add_argument("--database", default=DATABASE, help="its name must contain 'bench'")
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    parser.add_argument("--worker-touch", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.count, args.reps, args.touch = min(args.count, 200), min(args.reps, 20), min(args.touch, 200)
    if "bench" not in args.database:
        parser.error("the database's name must contain 'bench' (it is dropped)")
    base = os.environ.get("BENCH_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432")
    os.environ["BENCH_DATABASE_URL"] = f"{base}/{args.database}"  # read by bench.settings
    os.environ["CELERY_QUEUE"] = f"bench-tenants-{args.database}"  # nobody consumes it
    os.environ.setdefault("LOG_LEVEL", "ERROR")  # the rung-but-undelivered message, each sweep
    import django

    django.setup()
    if args.worker_touch:
        print(json.dumps(worker_touch(args.worker_touch)))
        return 0
    from bench.database import database_drop

    try:
        return bench(args)
    finally:
        queue_remove()
        if not args.keep:
            database_drop(args.database)


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.1f}/{five:.1f} on {os.cpu_count()} CPUs"


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def queue_remove() -> None:
    import redis
    from django.conf import settings

    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    for key in client.scan_iter(match=f"{settings.CELERY_TASK_DEFAULT_QUEUE}*"):
        client.delete(key)


def bench(args) -> int:
    from django.core.management import call_command

    from bench.database import bench_database_prepare

    say(f"tenants bench: {args.base} then {args.count} tenants; {load()}")
    started = time.monotonic()
    bench_database_prepare()
    say(f"public schema migrated in {time.monotonic() - started:.1f}s")
    create_ms = tenants_create(args.base)
    create_p50 = statistics.median(create_ms)
    say(f"tenant_create x{args.base}: p50 {create_p50:.0f} ms, max {max(create_ms):.0f} ms")
    script = reference_script(schema(0))
    fixture_make()
    small = costs(reps=args.reps)
    old_small = statistics.median(outbox_sweep_per_schema() for _ in range(min(args.reps, 10)))
    say(f"at {args.base}: {costs_line(small)}; per-schema outbox sweep {old_small:.2f} ms; {load()}")

    started = time.monotonic()
    bulk_make(script, first=args.base, count=args.count)
    say(f"{args.count - args.base} tenants made in bulk in {time.monotonic() - started:.0f}s "
        f"({(time.monotonic() - started) / max(args.count - args.base, 1) * 1000:.0f} ms each)")

    migrations_check(args.count)
    large = costs(reps=args.reps)
    old_large = statistics.median(outbox_sweep_per_schema() for _ in range(3))
    say(f"at {args.count}: {costs_line(large)}; per-schema outbox sweep {old_large:.1f} ms "
        f"({old_large / old_small:.1f}x); {load()}")
    tick_growth = large["tick"] / small["tick"]
    sweep_growth = max(large[name] / small[name] for name in ("outbox_sweep", "timer_sweep",
                                                                "watchdog"))
    say(f"growth from {args.base} to {args.count}: tick {tick_growth:.2f}, sweeps {sweep_growth:.2f}")

    touched = worker_process(args)
    say(f"worker touching {touched['touched']} tenants: RSS {touched['rss_start_mb']:.0f} MB "
        f"-> {touched['rss_mb']:.0f} MB")

    # Last, as it takes longest: what every deploy pays (nothing to apply).
    from django.conf import settings
    from django.db import connections

    settings.TENANT_MULTIPROCESSING_MAX_PROCESSES = os.cpu_count() or 2
    connections.close_all()
    started = time.monotonic()
    call_command("migrate_schemas", tenant=True, executor="multiprocessing", interactive=False,
                 verbosity=0)
    migrate_all = time.monotonic() - started
    say(f"migrate_schemas over {args.count} tenants ({settings.TENANT_MULTIPROCESSING_MAX_PROCESSES}"
        f" processes): {migrate_all:.0f}s; {load()}")

    print(f"tenants: count={args.count} create_p50_ms={create_p50:.0f} "
          f"migrate_all_s={migrate_all:.1f} tick_ms_10={small['tick']:.2f} "
          f"tick_ms_max={large['tick']:.2f} tick_growth={tick_growth:.2f} "
          f"sweep_growth={sweep_growth:.2f} worker_rss_mb={touched['rss_mb']:.0f}", flush=True)
    return 0 if tick_growth <= GOAL and sweep_growth <= GOAL else 1


def tenants_create(count: int) -> list[float]:
    """The first tenants, each the production way; returns milliseconds per tenant."""
    from tenants.services import tenant_create

    took = []
    for i in range(count):
        started = time.perf_counter()
        tenant_create(schema_name=schema(i))
        took.append((time.perf_counter() - started) * 1000)
    return took


def reference_script(reference: str) -> str:
    """SQL that makes the reference tenant's schema under the name __SCHEMA__: its DDL and its
    migration records and content types, as `tenant_create` left them."""
    from django.conf import settings

    from bench.database import server_dsn

    dsn = server_dsn(settings.DATABASES["default"]["NAME"])
    dump = ["pg_dump", "--dbname", dsn, "--schema", reference, "--no-owner"]
    ddl = subprocess.run([*dump, "--schema-only"], capture_output=True, text=True, check=True).stdout
    data = subprocess.run([*dump, "--data-only", "--inserts", "--table",
                           f"{reference}.django_migrations", "--table",
                           f"{reference}.django_content_type"],
                          capture_output=True, text=True, check=True).stdout
    lines = [line for line in (ddl + data).splitlines()
             if not line.startswith("\\")]  # psql's \restrict: not SQL
    return re.sub(rf"\b{reference}\b", "__SCHEMA__", "\n".join(lines))


def bulk_make(script: str, *, first: int, count: int) -> None:
    """Tenants first..count-1: their rows in public, their schemas replayed from `script`
    (SCHEMAS_PER_TRANSACTION per transaction, two connections), marked provisioned last. Each
    gets a parked run's timer and an outbox retry due tomorrow (rows in the public indexes)."""
    import psycopg
    from django.conf import settings
    from django.db import connection
    from django.utils import timezone

    from bench.database import server_dsn
    from runs.dispatch.models import TenantDue, Wakeup
    from tenants.models import Tenant

    names = [schema(i) for i in range(first, count)]
    connection.set_schema_to_public()
    Tenant.objects.bulk_create([Tenant(schema_name=n, name=n) for n in names], batch_size=1000)
    dsn = server_dsn(settings.DATABASES["default"]["NAME"])

    def replay(chunk: list[str]) -> None:
        with psycopg.connect(dsn, autocommit=True) as db:
            db.execute("SET synchronous_commit = off")  # a fixture: a crash loses the database
            with db.transaction():
                db.execute("\n".join(script.replace("__SCHEMA__", n) for n in chunk).encode())

    chunks = [names[i:i + SCHEMAS_PER_TRANSACTION]
              for i in range(0, len(names), SCHEMAS_PER_TRANSACTION)]
    done = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        for _ in pool.map(replay, chunks):
            done += 1
            if done % 20 == 0:
                say(f"  {done * SCHEMAS_PER_TRANSACTION} schemas made; {load()}")
    tenants = list(Tenant.objects.filter(schema_name__in=names))
    tomorrow = timezone.now() + timedelta(days=1)
    Wakeup.objects.bulk_create(
        [Wakeup(tenant=t, schema_name=t.schema_name, run_id=uuid_of(t.id), visit=1, due_at=tomorrow)
         for t in tenants], batch_size=1000)
    TenantDue.objects.bulk_create(
        [TenantDue(tenant=t, schema_name=t.schema_name, what=TenantDue.What.OUTBOX, due_at=tomorrow)
         for t in tenants], batch_size=1000)
    Tenant.objects.filter(schema_name__in=names).update(provisioned_at=timezone.now())
    with connection.cursor() as cursor:  # as autovacuum would have, had they come one by one
        for model in (Tenant, Wakeup, TenantDue):
            cursor.execute(f"ANALYZE public.{model._meta.db_table}")


def uuid_of(n: int) -> UUID:
    return UUID(int=n)


def migrations_check(count: int) -> None:
    """Every tenant's schema has exactly the reference's migration records."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM t0000.django_migrations")
        expected = cursor.fetchone()[0]
        cursor.execute(f"SELECT count(*) FROM {schema(count - 1)}.django_migrations")
        last = cursor.fetchone()[0]
    if last != expected:
        raise SystemExit(f"{schema(count - 1)} has {last} migrations recorded, t0000 {expected}")


class Fixture:
    run_id = None
    tenant = None


def fixture_make() -> None:
    """In FIXTURE: one queued run in the ready list, one due outbox message."""
    from django.db import connection
    from django_tenants.utils import schema_context

    from runs.effects.services import outbox_enqueue
    from runs.services import run_start
    from tenants.models import Tenant

    with schema_context(FIXTURE):
        run = run_start(agent="research", input={"topic": "tenants", "iterations": 1}).run
        outbox_enqueue(run_id=run.id, name="bench-note", connector="email",
                       args={"to": "nobody@bench.test"})
    connection.set_schema_to_public()
    Fixture.run_id, Fixture.tenant = run.id, Tenant.objects.get(schema_name=FIXTURE)


def fixture_reset() -> None:
    """The ready run handed out an hour ago and never claimed; a stale timer due a second ago."""
    from django.utils import timezone

    from runs.dispatch.models import ReadyRun, Wakeup

    now = timezone.now()
    ReadyRun.objects.filter(run_id=Fixture.run_id).update(dispatched_at=now - timedelta(hours=1))
    Wakeup.objects.update_or_create(
        run_id=Fixture.run_id, visit=999,
        defaults={"tenant": Fixture.tenant, "schema_name": FIXTURE,
                  "due_at": now - timedelta(seconds=1)})


def timed(call) -> float:
    fixture_reset()
    started = time.perf_counter()
    call()
    return (time.perf_counter() - started) * 1000


def costs(*, reps: int) -> dict[str, float]:
    """Milliseconds of the tick and of each sweep, the fastest of `reps` interleaved rounds:
    on a machine others load too, the fastest is the one least slowed by them (the medians are
    printed as well)."""
    from runs.dispatch import services as dispatch
    from runs.dispatch.tasks import tick
    from runs.effects.services import outbox_sweep

    checks = {"tick": lambda: tick.run(),
              "outbox_sweep": lambda: check(outbox_sweep(), 1, "outbox sweep"),
              "timer_sweep": lambda: check(dispatch.wakeups_fire(), 1, "timer sweep"),
              "watchdog": lambda: check(dispatch.watchdog()["requeued"], 1, "watchdog")}
    for call in checks.values():  # warm-up: caches, prepared statements, the broker
        timed(call)
    samples: dict[str, list[float]] = {name: [] for name in checks}
    for _ in range(reps):
        for name, call in checks.items():
            samples[name].append(timed(call))
    say("  medians: " + costs_line({name: statistics.median(v) for name, v in samples.items()}))
    return {name: min(values) for name, values in samples.items()}


def check(got: int, expected: int, what: str) -> None:
    if got != expected:
        raise SystemExit(f"{what} handled {got}, expected {expected}: the fixture is broken")


def costs_line(costs: dict[str, float]) -> str:
    return " ".join(f"{name} {ms:.2f} ms" for name, ms in costs.items())


def outbox_sweep_per_schema() -> float:
    """The outbox sweep before the due-index, for comparison: every active tenant's schema
    asked whether it has a due message (milliseconds; nothing rung)."""
    from django.db.models import Q
    from django.utils import timezone
    from django_tenants.utils import tenant_context

    from runs.effects.models import OutboxMessage
    from tenants.models import Tenant

    started = time.perf_counter()
    for tenant in Tenant.objects.filter(status=Tenant.Status.ACTIVE).exclude(provisioned_at=None):
        with tenant_context(tenant):
            now = timezone.now()
            list(OutboxMessage.objects.filter(
                Q(status="pending", next_attempt_at__lte=now) | Q(status="sending", claimed_until__lt=now))
                .order_by("next_attempt_at").values_list("id", flat=True)[:1])
    return (time.perf_counter() - started) * 1000


def worker_process(args) -> dict:
    """A fresh process touches `--touch` tenants and says its RSS."""
    answer = subprocess.run(
        [sys.executable, "-m", "bench", "tenants", "--database", args.database,
         "--worker-touch", str(min(args.touch, args.count - 1))],
        capture_output=True, text=True, check=True, cwd=ROOT, env=os.environ.copy())
    return json.loads(answer.stdout.strip().splitlines()[-1])


def worker_touch(count: int) -> dict:
    """What a worker does for tasks of `count` tenants, each in its schema; RSS before and after."""
    from django_tenants.utils import schema_context

    from runs.approvals.models import Approval
    from runs.effects.models import OutboxMessage
    from runs.effects.tasks import outbox_deliver_due
    from runs.models import Run
    from tenants.models import Tenant

    schemas = list(Tenant.objects.exclude(schema_name__in=["public", FIXTURE])
                   .order_by("schema_name").values_list("schema_name", flat=True)[:count])
    Run.objects.none().exists()  # connected, models loaded
    gc.collect()
    start = rss_mb()
    for name in schemas:
        with schema_context(name):
            Run.objects.filter(status=Run.Status.QUEUED).order_by("created_at").first()
            Approval.objects.filter(status=Approval.Status.PENDING).count()
            OutboxMessage.objects.filter(status=OutboxMessage.Status.UNKNOWN).count()
            outbox_deliver_due.run()  # nothing due: one claim attempt
    gc.collect()
    return {"touched": len(schemas), "rss_start_mb": start, "rss_mb": rss_mb()}
