"""Migration 0012 indexes finished runs for retention's pick of the runs due: on a table with
rows it is built CONCURRENTLY, so a run's writers go on while the build waits for the
transactions before it; in a new tenant's schema at once; an index an interrupted build left
invalid is rebuilt."""

import threading
import time

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from agentplatform.online_ddl import index_valid, table_empty
from tests.support.runs import finished, other_connection, start, waiting_on_a_lock
from tests.support.tenants import tenant_of_its_own

BEFORE, AFTER = ("runs", "0011_history_held_by_run"), ("runs", "0012_run_finished_index")
NAME = "runs_run_finished_idx"


def _migrate(target: tuple[str, str]) -> None:
    MigrationExecutor(connection).migrate([target])


def _valid() -> bool | None:
    with connection.cursor() as cursor:
        return index_valid(cursor, connection.schema_name, NAME)


@pytest.fixture(scope="module")
def fresh_tenant(django_db_setup, django_db_blocker, s3):
    with django_db_blocker.unblock(), tenant_of_its_own("finidx") as tenant:
        yield tenant


@pytest.fixture
def in_fresh_tenant(fresh_tenant):
    connection.set_tenant(fresh_tenant)
    yield fresh_tenant
    _migrate(AFTER)


def test_a_new_tenants_schema_has_it_and_backward_drops_it(in_fresh_tenant):
    assert _valid() is True
    _migrate(BEFORE)
    assert _valid() is None


def test_on_a_table_with_rows_the_runs_writers_go_on_while_it_is_built(in_fresh_tenant):
    schema = connection.schema_name
    held, other = (start("chatter", input={"steps": 1}) for _ in range(2))
    finished(held.id)
    _migrate(BEFORE)
    connection.ensure_connection()
    migrating = connection.connection.info.backend_pid
    holding, wrote = threading.Event(), []

    def writers():
        with other_connection() as holder, holder.transaction():
            # a run's claim or end, in flight when the deploy migrates
            holder.execute(f'UPDATE "{schema}".runs_run SET updated_at = now() WHERE id = %s',
                           [held.id])
            holding.set()
            deadline = time.monotonic() + 20
            while not waiting_on_a_lock(migrating) and time.monotonic() < deadline:
                time.sleep(0.02)
            with other_connection() as writer:  # another run's write, while the build waits
                writer.execute("SET statement_timeout = '5s'")
                wrote.append(writer.execute(
                    f'UPDATE "{schema}".runs_run SET updated_at = now() WHERE id = %s',
                    [other.id]).rowcount)

    thread = threading.Thread(target=writers)
    thread.start()
    assert holding.wait(20)
    _migrate(AFTER)  # waits for the holder's transaction; a plain build held the writer too
    thread.join(30)
    assert wrote == [1]
    assert _valid() is True


@pytest.fixture
def in_empty_tenant(s3):  # its own: the module's tenant has runs once a test above made some
    with tenant_of_its_own("finidx") as tenant:
        connection.set_tenant(tenant)
        yield tenant


def test_on_a_live_tenants_empty_table_a_writer_waits_for_the_build_no_more_than_its_timeout(
        in_empty_tenant):
    """A live tenant with no runs yet (or all archived): the index is built at once, in a
    transaction that gives up its place in the lock queue after 3 s (and retries), so a run's
    start queued behind it is not held for as long as an open insert before it."""
    schema = connection.schema_name
    _migrate(BEFORE)
    with connection.cursor() as cursor:
        assert table_empty(cursor, schema, "runs_run")
    connection.ensure_connection()
    migrating = connection.connection.info.backend_pid
    holding, order = threading.Event(), []

    def writers():
        with other_connection() as holder, holder.transaction():
            holder.execute(f'LOCK TABLE "{schema}".runs_run IN ROW EXCLUSIVE MODE')  # an open insert
            holding.set()
            deadline = time.monotonic() + 20
            while not waiting_on_a_lock(migrating) and time.monotonic() < deadline:
                time.sleep(0.02)
            try:
                with other_connection() as writer:  # queued behind the build's lock request
                    writer.execute("SET statement_timeout = '15s'")  # else held until the holder ends
                    writer.execute(f'UPDATE "{schema}".runs_run SET updated_at = now()')
                    order.append("writer")
            finally:
                order.append("holder")  # ends its transaction: the build's retry goes through

    thread = threading.Thread(target=writers)
    thread.start()
    assert holding.wait(20)
    _migrate(AFTER)
    thread.join(30)
    assert order == ["writer", "holder"]
    assert _valid() is True


def test_an_index_an_interrupted_build_left_invalid_is_rebuilt(in_fresh_tenant):
    finished(start("chatter", input={"steps": 1}).id)
    _migrate(BEFORE)
    with connection.cursor() as cursor:  # as a concurrent build killed part-way leaves it
        cursor.execute(f"CREATE INDEX {NAME} ON runs_run (finished_at, id) "
                       "WHERE finished_at IS NOT NULL")
        cursor.execute(f"UPDATE pg_index SET indisvalid = false WHERE indexrelid = "
                       f"'{connection.schema_name}.{NAME}'::regclass")
    assert _valid() is False
    _migrate(AFTER)
    assert _valid() is True


def test_a_new_tenant_is_not_held_by_a_long_transaction_elsewhere(django_db_setup, s3):
    """A concurrent build waits for every older transaction in the database (a backup's, a
    report's): a new tenant's tables are empty, and their index is built at once."""
    created, gave_up = threading.Event(), []

    def long_transaction():
        with other_connection() as other, other.transaction():
            # a snapshot held for the transaction's length, as pg_dump's
            other.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            other.execute("SELECT count(*) FROM pg_class")
            holding.set()
            if not created.wait(30):
                gave_up.append(True)  # the tenant's migration waited for this transaction

    holding = threading.Event()
    thread = threading.Thread(target=long_transaction)
    thread.start()
    assert holding.wait(20)
    with tenant_of_its_own("finidx") as tenant:
        created.set()
        thread.join(40)
        assert gave_up == []
        connection.set_tenant(tenant)
        assert _valid() is True
