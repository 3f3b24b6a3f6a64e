"""The test session: a fresh database with two tenants, acme and globex, and real Celery workers
(run workers on CELERY_QUEUE, an outbox delivery worker on CELERY_OUTBOX_QUEUE).

Tests talk to committed data over real connections (workers are separate processes), so each
test makes its own rows with fresh ids instead of relying on rollback.
"""

import os
import signal
import subprocess
import time
from pathlib import Path

import psycopg
import pytest
import redis
from django.conf import settings
from django.core.management import call_command
from django.db import connection, connections
from django_tenants.utils import tenant_context

from agentplatform import localprocs
from agentplatform.s3 import s3_client
from tenants.models import Tenant
from tenants.services import tenant_create
from tests.settings import SLOT
from tests.support.api import api_client
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parent.parent


def _admin_dsn(db: dict) -> str:
    return (f"host={db['HOST'] or '127.0.0.1'} port={db['PORT'] or 5432} "
            f"user={db['USER'] or 'postgres'} dbname=postgres")


@pytest.fixture(scope="session")
def django_db_setup(django_db_blocker):
    name = settings.DATABASES["default"]["NAME"]
    assert name.endswith("_test"), f"refusing to recreate {name!r}: test databases end in _test"
    # PostgreSQL itself, even when the tests go through a pooler (TEST_POOLER_URL)
    with psycopg.connect(_admin_dsn(settings.DATABASE_DIRECT), autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", [name]
        )
        admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        admin.execute(f'CREATE DATABASE "{name}"')
    with django_db_blocker.unblock():
        call_command("migrate_schemas", shared=True, interactive=False, verbosity=0)

        keys = {}
        for schema in ("acme", "globex"):
            keys[schema] = tenant_create(schema_name=schema).api_key
        connection.set_schema_to_public()
    os.environ["TEST_ACME_KEY"], os.environ["TEST_GLOBEX_KEY"] = keys["acme"], keys["globex"]
    yield
    with django_db_blocker.unblock():
        orphans = _orphaned_history()
    connections.close_all()
    assert not orphans, f"history rows whose run is gone, after the session: {orphans}"


def _orphaned_history() -> dict[str, int]:
    """Checkpoints and log entries whose run is gone, by schema and table, in every schema the
    session left. No foreign key refuses them (runs/models.py HISTORY_HELD_BY_RUN): the suite's
    end checks that no path it took wrote one or left one behind."""
    found = {}
    with connection.cursor() as cursor:
        cursor.execute("SELECT table_schema, table_name FROM information_schema.tables "
                       "WHERE table_name IN ('runs_checkpoint', 'runs_logentry')")
        for schema, table in cursor.fetchall():
            cursor.execute(f'SELECT count(*) FROM "{schema}".{table} h WHERE NOT EXISTS '
                           f'(SELECT FROM "{schema}".runs_run r WHERE r.id = h.run_id)')
            if count := cursor.fetchone()[0]:
                found[f"{schema}.{table}"] = count
    return found


@pytest.fixture(autouse=True)
def _db(django_db_setup, django_db_blocker):
    with django_db_blocker.unblock():
        connection.set_schema_to_public()
        yield
        connection.set_schema_to_public()


@pytest.fixture
def acme():
    return Tenant.objects.get(schema_name="acme")


@pytest.fixture
def globex():
    return Tenant.objects.get(schema_name="globex")


@pytest.fixture
def in_acme(acme):
    with tenant_context(acme):
        yield acme


@pytest.fixture
def acme_api():
    return api_client(os.environ["TEST_ACME_KEY"])


@pytest.fixture
def globex_api():
    return api_client(os.environ["TEST_GLOBEX_KEY"])


LOGS = ROOT / ".dev" / "test-logs" / f"slot{SLOT}"  # two shards' "worker.log" never mix


def Worker(name: str, concurrency: int = 1, env: dict | None = None) -> localprocs.Worker:  # noqa: N802
    return localprocs.Worker(name, concurrency, log_dir=LOGS, env=env)


@pytest.fixture(scope="session")
def celery_queue_clean(django_db_setup):
    redis.Redis.from_url(settings.CELERY_BROKER_URL).flushdb()


class SeaweedFS:
    """A real S3 server (`weed mini`, via deploy/seaweedfs) for this test session."""

    def __init__(self, port: int, data_dir: Path):
        self.port, self.endpoint = port, f"http://127.0.0.1:{port}"
        log = (ROOT / ".dev" / "test-logs" / f"seaweedfs-{port}.log")
        log.parent.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            ["bash", str(ROOT / "deploy" / "seaweedfs"), "start", "--dir", str(data_dir),
             "--port", str(port), "--bucket", settings.S3_BUCKET],
            cwd=ROOT, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True,
        )
        self.log = log

    def wait_ready(self):
        def bucket_ready():
            assert self.process.poll() is None, self.log.read_text()[-3000:]
            try:
                s3_client().head_bucket(Bucket=settings.S3_BUCKET)
                return True
            except Exception:
                try:
                    s3_client().create_bucket(Bucket=settings.S3_BUCKET)
                except Exception:
                    pass
                return False

        wait_for(bucket_ready, timeout=60, interval=0.3, what="SeaweedFS S3 to answer")
        return self

    def stop(self):
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)


@pytest.fixture(scope="session")
def s3(tmp_path_factory):
    """S3 for the session; workers started afterwards inherit S3_ENDPOINT_URL."""
    server = SeaweedFS(settings.SEAWEEDFS_PORT, tmp_path_factory.mktemp("seaweedfs"))
    settings.S3_ENDPOINT_URL = os.environ["S3_ENDPOINT_URL"] = server.endpoint
    try:
        yield server.wait_ready()
    finally:
        server.stop()


class BeatHolder:
    """The session's beat process; a test may stop it, and `ensure()` starts a new one."""

    made: list["BeatHolder"] = []

    def __init__(self, schedule_dir: Path):
        self.schedule_dir, self.process = schedule_dir, None
        BeatHolder.made.append(self)
        self.ensure()

    def ensure(self) -> "BeatHolder":
        if self.process is None or self.process.process.poll() is not None:
            self.process = localprocs.Beat(self.schedule_dir, log_dir=LOGS)
        return self

    def stop(self):
        if self.process is not None:
            self.process.stop()


@pytest.fixture(scope="session")
def _session_beat(celery_queue_clean, tmp_path_factory):
    holder = BeatHolder(tmp_path_factory.mktemp("beat"))
    yield holder
    holder.stop()


@pytest.fixture
def beat(_session_beat):
    return _session_beat.ensure()


@pytest.fixture
def no_beat():
    """Nothing hands runs out while the test runs: the session's beat, if an earlier test
    started it, is stopped (the next test that asks for `beat` starts it again). For tests that
    leave runs stuck or in line on purpose, next to the session's workers."""
    for holder in BeatHolder.made:
        holder.stop()


@pytest.fixture
def room(settings, acme):
    """Caps that earlier tests' runs, still counted as handed out (no beat's watchdog about to
    take them back, with `no_beat`), cannot fill: for tests about who hands a run out, not the
    caps. In this process only (the dispatches a test's requests make)."""
    settings.DISPATCH_MAX_IN_FLIGHT = settings.RUN_TENANT_MAX_IN_FLIGHT = 100_000
    cap = Tenant.objects.get(pk=acme.pk).max_in_flight
    Tenant.objects.filter(pk=acme.pk).update(max_in_flight=None)
    yield
    Tenant.objects.filter(pk=acme.pk).update(max_in_flight=cap)


@pytest.fixture(scope="session")
def _session_worker(celery_queue_clean, s3, _session_beat):
    workers = [Worker("session-worker", concurrency=2).wait_ready()]
    yield workers
    workers[-1].stop()


@pytest.fixture(scope="session")
def _session_outbox(celery_queue_clean, s3):
    workers = [localprocs.Worker.outbox("session-outbox", log_dir=LOGS).wait_ready()]
    yield workers
    workers[-1].stop()


@pytest.fixture
def outbox_worker(_session_outbox):
    """The session's outbox delivery worker (its own queue); restarted if a test killed it."""
    if _session_outbox[-1].process.poll() is not None:
        _session_outbox.append(localprocs.Worker.outbox(
            f"session-outbox-{len(_session_outbox)}", log_dir=LOGS).wait_ready())
    return _session_outbox[-1]


@pytest.fixture
def worker(_session_worker, beat, outbox_worker):
    """A worker process (and beat, and outbox delivery) shared by the session; restarted if a
    test killed it."""
    if _session_worker[-1].process.poll() is not None:
        _session_worker.append(Worker(f"session-worker-{len(_session_worker)}", 2).wait_ready())
    return _session_worker[-1]


@pytest.fixture
def own_workers(_session_worker):
    """Only the test's own workers take runs: the session's worker is stopped (drained), and
    the next test that asks for `worker` starts it again. For tests that must know which
    worker holds a run: the session's short slices would move it between look and act."""
    _session_worker[-1].stop()


@pytest.fixture
def start_worker(celery_queue_clean, s3, beat, outbox_worker):
    """Start extra workers for one test (`env`: settings of their own); all are stopped
    afterwards. `ready=False` returns at once, without waiting for the worker to answer."""
    started = []

    def start(name: str, concurrency: int = 1, env: dict | None = None,
              ready: bool = True) -> Worker:
        process = Worker(f"{name}-{time.monotonic_ns()}", concurrency, env)
        started.append(process)
        return process.wait_ready() if ready else process

    yield start
    for process in started:
        process.stop()


@pytest.fixture
def start_outbox_worker(celery_queue_clean, s3):
    """Start extra outbox delivery workers for one test; all are stopped afterwards."""
    started = []

    def start(name: str) -> localprocs.Worker:
        process = localprocs.Worker.outbox(f"{name}-{time.monotonic_ns()}", log_dir=LOGS)
        started.append(process)
        return process.wait_ready()

    yield start
    for process in started:
        process.stop()
