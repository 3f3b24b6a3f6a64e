"""Behind a transaction pool (PgBouncer, pool_mode=transaction), no tenant's schema reaches
another tenant's transaction: acme and globex, interleaved on one server connection.

The pool here has a single server connection, so every statement of both clients runs on it;
`pg_backend_pid()` shows that they do. A `SET search_path` left on that connection by one
client is what the other's next transaction would run in (docs/decisions/0022).
"""

import copy
import os
import signal
import socket
import subprocess
from pathlib import Path

import psycopg
import pytest
from django.conf import settings
from django.db import connection, connections, transaction
from django_tenants.postgresql_backend import base as django_tenants_backend
from django_tenants.utils import tenant_context

from agentplatform.tenant_database import base as tenant_backend
from runs.models import Run
from runs.services import run_start
from tests.settings import SLOT
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_PATH = '"$user", public'


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def one_server_connection():
    """A PgBouncer in transaction mode with one server connection, in front of PostgreSQL
    itself (DATABASE_DIRECT: even when the suite already runs through a pooler). One per test:
    each starts on a server connection nobody has set anything on."""
    direct, port = settings.DATABASE_DIRECT, free_port()
    log = ROOT / ".dev" / "test-logs" / f"pgbouncer-pool-of-one-{SLOT}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    process = subprocess.Popen(
        ["bash", str(ROOT / "deploy" / "pgbouncer"), "start", "--pool-size", "1",
         "--dir", str(ROOT / ".dev" / f"pgbouncer-pool-of-one-{SLOT}"), "--port", str(port),
         "--upstream", f"{direct['HOST'] or '127.0.0.1'}:{direct['PORT'] or 5432}",
         "--user", direct["USER"] or "postgres"],
        stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)

    def answers():
        assert process.poll() is None, log.read_text()
        try:
            psycopg.connect(**raw_params(port), connect_timeout=2).close()
            return True
        except psycopg.OperationalError:
            return False

    try:
        wait_for(answers, timeout=30, interval=0.2, what="PgBouncer to answer")
        yield port
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=15)


def raw_params(port: int) -> dict:
    db = settings.DATABASES["default"]
    return {"host": "127.0.0.1", "port": port, "dbname": db["NAME"],
            "user": db["USER"] or "postgres", "autocommit": True}


@pytest.fixture
def pooled(one_server_connection):
    """pooled(backend, tenant): a Django connection of that backend through the pool, selected
    to the tenant, registered in `connections` for the ORM (`using=`) in this thread."""
    made = []

    def make(backend, tenant):
        settings_dict = copy.deepcopy(connection.settings_dict)
        settings_dict.update(HOST="127.0.0.1", PORT=str(one_server_connection), OPTIONS={},
                             CONN_MAX_AGE=0, DISABLE_SERVER_SIDE_CURSORS=True)
        alias = f"pooled-{tenant.schema_name}-{len(made)}"
        wrapper = backend.DatabaseWrapper(settings_dict, alias)
        wrapper.set_tenant(tenant)
        connections[alias] = wrapper
        made.append(alias)
        return wrapper

    yield make
    for alias in made:
        connections[alias].close()
        del connections[alias]


@pytest.fixture
def two_runs(acme, globex):
    """One run in each tenant: {schema: run id}."""
    ids = {}
    for tenant in (acme, globex):
        with tenant_context(tenant):
            ids[tenant.schema_name] = run_start(agent="research", input={}, enqueue=False).run.id
    return ids


def visible(cursor, ids) -> set:
    cursor.execute(f"SELECT id FROM {Run._meta.db_table} WHERE id IN (%s, %s)", list(ids.values()))
    return {row[0] for row in cursor.fetchall()}


def server_search_path(port: int) -> str:
    """What a client that sets nothing finds on the one server connection."""
    with psycopg.connect(**raw_params(port)) as plain:
        return plain.execute("SHOW search_path").fetchone()[0]


def test_the_stock_django_tenants_backend_leaks_a_schema_through_the_pool(
        acme, globex, two_runs, pooled, one_server_connection):
    """Why the platform has a backend of its own: with django-tenants' `SET search_path` (a
    session setting, sent as a statement of its own), acme's query runs in globex."""
    in_acme = pooled(django_tenants_backend, acme)
    in_globex = pooled(django_tenants_backend, globex)
    acme_cursor = in_acme.cursor()  # SET search_path = acme, public: a transaction of its own
    globex_cursor = in_globex.cursor()  # SET search_path = globex, public on the same connection
    assert visible(acme_cursor, two_runs) == {two_runs["globex"]}
    assert server_search_path(one_server_connection) == "globex, public"
    acme_cursor.close()
    globex_cursor.close()


def test_no_tenant_search_path_reaches_another_tenants_transaction(
        acme, globex, two_runs, pooled, one_server_connection):
    in_acme, in_globex = pooled(tenant_backend, acme), pooled(tenant_backend, globex)

    def pid(wrapper):
        with wrapper.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            return cursor.fetchone()[0]

    assert pid(in_acme) == pid(in_globex)  # one server connection for both

    # Autocommit, interleaved: cursors opened in one order, used in the other.
    acme_cursor, globex_cursor = in_acme.cursor(), in_globex.cursor()
    assert visible(globex_cursor, two_runs) == {two_runs["globex"]}
    assert visible(acme_cursor, two_runs) == {two_runs["acme"]}
    assert visible(globex_cursor, two_runs) == {two_runs["globex"]}
    for cursor, schema in ((acme_cursor, "acme"), (globex_cursor, "globex")):
        cursor.execute("SELECT current_schema()")  # without parameters: another code path
        assert cursor.fetchone()[0] == schema
    acme_cursor.executemany(f"UPDATE {Run._meta.db_table} SET status = status WHERE id = %s",
                            [[run_id] for run_id in two_runs.values()])
    assert acme_cursor.rowcount == 1  # acme's run only
    acme_cursor.close()
    globex_cursor.close()

    # The ORM, alternating.
    for _ in range(3):
        assert set(Run.objects.using(in_acme.alias).values_list("id", flat=True)
                   .filter(id__in=two_runs.values())) == {two_runs["acme"]}
        assert set(Run.objects.using(in_globex.alias).values_list("id", flat=True)
                   .filter(id__in=two_runs.values())) == {two_runs["globex"]}

    # A transaction holds the connection; what it selected ends with it.
    with transaction.atomic(using=in_acme.alias):
        assert Run.objects.using(in_acme.alias).filter(id=two_runs["acme"]).exists()
        with transaction.atomic(using=in_acme.alias):  # a savepoint
            assert Run.objects.using(in_acme.alias).filter(id=two_runs["acme"]).exists()
        assert not Run.objects.using(in_acme.alias).filter(id=two_runs["globex"]).exists()
    assert set(Run.objects.using(in_globex.alias).values_list("id", flat=True)
               .filter(id__in=two_runs.values())) == {two_runs["globex"]}

    # A tenant switch on one client takes effect at its next statement.
    in_acme.set_tenant(globex)
    assert Run.objects.using(in_acme.alias).filter(id=two_runs["globex"]).exists()
    in_acme.set_tenant(acme)

    # Nothing any of them selected stayed on the server connection.
    assert server_search_path(one_server_connection) == DEFAULT_PATH


def test_a_statement_postgresql_refuses_in_a_transaction_still_runs_in_the_tenants_schema(acme):
    """VACUUM cannot share a message with the SET LOCAL: it runs after a session SET (right
    straight to PostgreSQL, where migrations and maintenance run)."""
    with tenant_context(acme), connection.cursor() as cursor:
        cursor.execute(f"VACUUM {Run._meta.db_table}")
        cursor.execute("SELECT current_schema()")
        assert cursor.fetchone()[0] == "acme"
