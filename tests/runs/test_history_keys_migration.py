"""Migration 0011 drops the foreign keys from checkpoints and log entries to their run (each
writer holds the run's row instead: runs/models.py HISTORY_HELD_BY_RUN); back, they are added
again and validated against the rows written meanwhile, and refuse an orphan again. It takes
its locks in the writers' order, so a writer holding a run's row while it reads the run's
checkpoints is waited for, not deadlocked with; a backward run interrupted after adding a key
NOT VALID validates it when run again."""

import threading
import time
import uuid

import pytest
from django.db import IntegrityError, connection, transaction
from django.db.migrations.executor import MigrationExecutor

from runs.models import Checkpoint
from tests.support.runs import finished, other_connection, start, waiting_on_a_lock
from tests.support.tenants import tenant_of_its_own

BEFORE, AFTER = ("runs", "0010_natural_keys"), ("runs", "0011_history_held_by_run")


def _migrate(target: tuple[str, str]) -> None:
    MigrationExecutor(connection).migrate([target])


def _keys() -> dict[str, bool]:
    """Each table's foreign key to the run table: whether it is validated."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT conrelid::regclass::text, convalidated FROM pg_constraint "
                       "WHERE contype = 'f' AND confrelid = 'runs_run'::regclass "
                       "AND conrelid IN ('runs_checkpoint'::regclass, 'runs_logentry'::regclass)")
        return dict(cursor.fetchall())


def _orphan_checkpoint() -> None:
    Checkpoint.objects.create(run_id=uuid.uuid4(), visit=0, step=None, state={},
                              log_offsets={}, agent_version=1, topology_hash="x")


@pytest.fixture(scope="module")
def fresh_tenant(django_db_setup, django_db_blocker, s3):
    with django_db_blocker.unblock(), tenant_of_its_own("histkeys") as tenant:
        yield tenant


@pytest.fixture
def in_fresh_tenant(fresh_tenant):  # its schema at 0011 (where each test leaves it)
    connection.set_tenant(fresh_tenant)
    _migrate(AFTER)
    yield fresh_tenant
    _migrate(AFTER)


def test_the_keys_go_forward_and_come_back_validated(in_fresh_tenant):
    assert _keys() == {}
    run = finished(start("chatter", input={"steps": 2}).id)  # rows written without the keys
    _migrate(BEFORE)
    assert _keys() == {"runs_checkpoint": True, "runs_logentry": True}
    with pytest.raises(IntegrityError), transaction.atomic():
        _orphan_checkpoint()
    assert Checkpoint.objects.filter(run=run).count() == 4
    _migrate(AFTER)
    assert _keys() == {}


@pytest.mark.parametrize("target", [BEFORE, AFTER])
def test_a_writer_holding_a_run_while_it_reads_its_checkpoints_is_waited_for(in_fresh_tenant,
                                                                            target):
    """A wake-up, a fork or the archive pass locks a run's row and then reads or writes its
    history: the migration, both ways, waits for it instead of deadlocking with it."""
    schema, run = connection.schema_name, finished(start("chatter", input={"steps": 1}).id)
    if target == AFTER:
        _migrate(BEFORE)
    connection.ensure_connection()
    migrating = connection.connection.info.backend_pid
    holding, seen = threading.Event(), []

    def writer():
        with other_connection() as conn, conn.transaction():
            conn.execute(f'SELECT FROM "{schema}".runs_run WHERE id = %s FOR UPDATE', [run.id])
            holding.set()
            deadline = time.monotonic() + 20
            while not waiting_on_a_lock(migrating) and time.monotonic() < deadline:
                time.sleep(0.02)
            seen.append(conn.execute(f'SELECT count(*) FROM "{schema}".runs_checkpoint '
                                     "WHERE run_id = %s", [run.id]).fetchone()[0])

    thread = threading.Thread(target=writer)
    thread.start()
    assert holding.wait(20)
    _migrate(target)  # raised a deadlock (40P01) when it locked the history table first
    thread.join(20)
    assert seen == [3]
    assert _keys() == ({} if target == AFTER else {"runs_checkpoint": True, "runs_logentry": True})


def test_a_backward_run_interrupted_before_validating_validates_when_run_again(in_fresh_tenant):
    finished(start("chatter", input={"steps": 1}).id)
    with connection.cursor() as cursor:  # as a backward run killed between its two steps leaves it
        cursor.execute("ALTER TABLE runs_checkpoint ADD CONSTRAINT runs_checkpoint_run_fk "
                       "FOREIGN KEY (run_id) REFERENCES runs_run (id) NOT VALID")
    assert _keys() == {"runs_checkpoint": False}
    _migrate(BEFORE)
    assert _keys() == {"runs_checkpoint": True, "runs_logentry": True}
    _migrate(AFTER)
