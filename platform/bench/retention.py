"""`python -m bench retention`: N finished runs of S steps, the archive job, and the hot store's
size before the runs, with them, and after the job.

Runs in its own database (agentplatform_bench_retention, suffixed by BENCH_SLOT, else
TEST_SLOT, when set; dropped and created here), against a real S3: S3_ENDPOINT_URL if set, else a
SeaweedFS started here on a free port. Rows are
inserted in bulk with SQL (the engine is not what is measured); the archive job is the real
one (`retention.services.archive_pass`, what the per-tenant Celery task calls), in-process.

The hot store is every relation (heap, TOAST, indexes) of the run tables in the tenant's
schema: runs_run and every table with a ForeignKey to Run. Each measurement follows a
VACUUM FULL of those tables, so it counts live data, not dead tuples waiting for autovacuum.
The archive catalog (retention_archive, one small row per archived run) is reported apart.
"""

import argparse
import base64
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # platform/<package>/ -> the checkout
SLOT = os.environ.get("BENCH_SLOT", os.environ.get("TEST_SLOT", ""))
DATABASE = f"agentplatform_bench_retention{SLOT}"  # engineers sharing the server: one each
OWN_DJANGO_SETUP = True
SCHEMA = "bench"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench retention")
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--keep", action="store_true", help="keep the bench database afterwards")
    args = parser.parse_args(argv)

    server = s3_environment()
    database_environment()
    try:
        return bench(args)
    finally:
        if not args.keep:
            database_drop()
        if server is not None:
            server.terminate()
            server.wait(timeout=30)


def database_environment() -> None:
    base = os.environ.get("BENCH_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432")
    os.environ["DATABASE_URL"] = f"{base}/{DATABASE}"  # set before Django reads .env: it wins
    os.environ["DJANGO_SETTINGS_MODULE"] = "agentplatform.settings"
    os.environ.setdefault("DJANGO_SECRET_KEY", secrets.token_urlsafe(40))
    os.environ.setdefault("AGENTPLATFORM_MASTER_KEY", base64.b64encode(os.urandom(32)).decode())
    os.environ.setdefault("AGENT_MODULES", "agents")
    os.environ["LOG_LEVEL"] = "WARNING"
    with admin_connection() as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{DATABASE}"')


def admin_connection():
    import psycopg

    base = os.environ.get("BENCH_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432")
    return psycopg.connect(f"{base}/postgres", autocommit=True)


def database_drop() -> None:
    from django.db import connections

    connections.close_all()
    with admin_connection() as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)')


def ports_free(first: int, count: int = 10) -> bool:
    for port in range(first, first + count):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                return False
    return True


def s3_environment() -> subprocess.Popen | None:
    """Use the configured S3, or start SeaweedFS (deploy/seaweedfs) on free ports."""
    os.environ.setdefault("S3_BUCKET", "agentplatform-bench")
    if os.environ.get("S3_ENDPOINT_URL"):
        return None
    # A server of the benchmark's own, so credentials of its own too (settings have no default
    # ones outside deploy/dev); deploy/seaweedfs writes the same pair into its identity file.
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "agentplatform-bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", secrets.token_urlsafe(24))
    first = 19400 + 60 * (int(SLOT or 0) % 10)  # slots start apart, so they rarely race for one
    port = next(p for p in [*range(first, 20000, 10), *range(19400, first, 10)] if ports_free(p))
    directory = tempfile.mkdtemp(prefix="bench-seaweedfs-")
    log = open(Path(directory) / "seaweedfs.log", "wb")
    server = subprocess.Popen(
        ["bash", str(ROOT / "deploy" / "seaweedfs"), "start", "--dir", directory, "--port", str(port),
         "--bucket", os.environ["S3_BUCKET"]], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    os.environ["S3_ENDPOINT_URL"] = f"http://127.0.0.1:{port}"
    return server


def s3_wait(timeout: float = 60.0) -> None:
    from django.conf import settings

    from agentplatform.s3 import s3_client

    deadline = time.monotonic() + timeout
    while True:
        try:
            s3_client().head_bucket(Bucket=settings.S3_BUCKET)
            return
        except Exception:
            try:
                s3_client().create_bucket(Bucket=settings.S3_BUCKET)
            except Exception:
                pass
        if time.monotonic() > deadline:
            raise SystemExit(f"S3 at {settings.S3_ENDPOINT_URL} did not answer in {timeout}s")
        time.sleep(0.3)


def hot_tables() -> list[str]:
    from runs.models import Run
    from runs.retention.selectors import run_tables

    return [Run._meta.db_table] + [table.name for table in run_tables()]


def relation_bytes(tables: list[str]) -> int:
    """VACUUM FULL, then the total size (heap + TOAST + indexes) of `tables` in the schema."""
    from django.db import connection

    with connection.cursor() as cursor:
        for table in tables:
            cursor.execute(f'VACUUM FULL "{SCHEMA}"."{table}"')
        cursor.execute(
            "SELECT coalesce(sum(pg_total_relation_size(format('%%I.%%I', %s, t)::regclass)), 0) "
            "FROM unnest(%s::text[]) AS t", [SCHEMA, tables])
        return int(cursor.fetchone()[0])


def runs_insert(*, runs: int, steps: int) -> None:
    """`runs` succeeded runs of `steps` chatter steps, as the engine would have left them:
    checkpoints 0..steps+1, one ~200-byte log entry per step, created and succeeded events."""
    from datetime import timedelta

    from django.db import connection, transaction
    from django.utils import timezone

    from runs.agents import registry
    from runs.models import Run

    agent = registry.get("research")  # any registered agent: only its policy is consulted
    ended = timezone.now() - timedelta(days=365)
    with transaction.atomic():
        Run.objects.bulk_create(
            [Run(agent=agent.name, agent_version=agent.version, topology_hash=agent.topology_hash,
                 status=Run.Status.SUCCEEDED, input={"steps": steps}, result={"said": steps},
                 steps_taken=steps + 1, started_at=ended, finished_at=ended) for _ in range(runs)],
            batch_size=1000)
        with connection.cursor() as cursor:
            cursor.execute("""
                INSERT INTO runs_checkpoint (run_id, visit, step, state, log_offsets,
                                             agent_version, topology_hash, created_at)
                SELECT r.id, v, CASE WHEN v <= %s THEN 'talk' END,
                       jsonb_build_object('said', v, 'steps', %s),
                       jsonb_build_object('messages', least(v, %s)),
                       r.agent_version, r.topology_hash, r.finished_at
                  FROM runs_run r, generate_series(0, %s + 1) AS v""", [steps, steps, steps, steps])
            cursor.execute("""
                INSERT INTO runs_logentry (run_id, log, index, visit, value)
                SELECT r.id, 'messages', i, i + 1,
                       jsonb_build_object('n', i + 1, 'text',
                                          'message ' || lpad((i + 1)::text, 6, '0') || ' '
                                          || md5(r.id::text || i) || repeat('x', 148))
                  FROM runs_run r, generate_series(0, %s - 1) AS i""", [steps])
            cursor.execute("""
                INSERT INTO runs_runevent (run_id, kind, visit, data, created_at)
                SELECT r.id, k.kind, k.visit, k.data, r.finished_at
                  FROM runs_run r, (VALUES ('run_created', 0, '{"durability": "sync"}'::jsonb),
                                           ('run_succeeded', %s, '{"error": ""}'::jsonb))
                       AS k(kind, visit, data)""", [steps + 1])


def bench(args) -> int:
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connection

    from runs.models import Run
    from runs.retention import services
    from runs.retention.models import Archive
    from tenants.services import tenant_create

    s3_wait()
    call_command("migrate_schemas", shared=True, interactive=False, verbosity=0)
    tenant = tenant_create(schema_name=SCHEMA).tenant
    connection.set_tenant(tenant)
    tables = hot_tables()

    empty = relation_bytes(tables)
    started = time.monotonic()
    runs_insert(runs=args.runs, steps=args.steps)
    print(f"inserted {args.runs} runs x {args.steps} steps in {time.monotonic() - started:.1f}s",
          file=sys.stderr)
    full = relation_bytes(tables)

    started, cpu_started = time.monotonic(), time.process_time()
    archived = failed = 0
    while Run.objects.exists():
        report = services.archive_pass(tenant=tenant, limit=args.runs)
        archived, failed = archived + report.archived, failed + report.failed
        if report.failed or not report.archived:
            break
    elapsed, cpu = time.monotonic() - started, time.process_time() - cpu_started
    after = relation_bytes(tables)

    stored = sum(Archive.objects.values_list("size", flat=True))
    catalog = relation_bytes([Archive._meta.db_table])
    print(f"archived {archived} runs ({failed} failed) in {elapsed:.1f}s ({cpu:.1f}s of this "
          f"process's CPU; chunks of {settings.RETENTION_CHUNK_SIZE} runs, "
          f"{settings.RETENTION_UPLOAD_CONCURRENCY} uploads at once); {stored} bytes in S3; "
          f"archive catalog {catalog} bytes; hot tables {', '.join(tables)}", file=sys.stderr)
    print(f"retention: runs={archived} archived_per_s={archived / elapsed:.1f} "
          f"hot_bytes_empty={empty} hot_bytes_full={full} hot_bytes_after={after}")
    return 0 if archived == args.runs and after <= 1.05 * empty else 1
