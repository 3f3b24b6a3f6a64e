"""Migration 0010 keys checkpoints and log entries on (run, visit) and (run, log, index): a
tenant schema holding runs from before migrates forward with every row kept, back again, and
the natural key refuses a second row for the same place, as the unique constraints did."""

import uuid

import pytest
from django.db import IntegrityError, connection, transaction
from django.db.migrations.executor import MigrationExecutor

from runs.models import Checkpoint, LogEntry
from tenants.services import tenant_create, tenant_delete
from tests.support.runs import finished, start

BEFORE, AFTER = ("runs", "0009_state_rules"), ("runs", "0010_natural_keys")


def _migrate(target: tuple[str, str]) -> None:
    executor = MigrationExecutor(connection)
    executor.migrate([target])


def _primary_key(table: str) -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("""
            SELECT a.attname FROM pg_index i
              JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
             WHERE i.indrelid = %s::regclass AND i.indisprimary
             ORDER BY array_position(i.indkey::int[], a.attnum::int)""", [table])
        return [row[0] for row in cursor.fetchall()]


def _rows(table: str, columns: str) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {columns} FROM {table} ORDER BY {columns}")
        return cursor.fetchall()


@pytest.fixture
def in_fresh_tenant(s3):  # its own schema, migrated back and forth; deleted after
    tenant = tenant_create(schema_name=f"natkeys{uuid.uuid4().hex[:8]}").tenant
    try:
        connection.set_tenant(tenant)
        yield tenant
    finally:
        connection.set_schema_to_public()
        tenant_delete(tenant=tenant)


def test_runs_from_before_keep_every_row_through_the_migration_back_and_forth(in_fresh_tenant):
    _migrate(BEFORE)
    assert _primary_key("runs_checkpoint") == ["id"]
    assert _primary_key("runs_logentry") == ["id"]
    old = finished(start("chatter", input={"steps": 2}).id)  # written with ids drawn
    assert old.status == "succeeded"
    checkpoints_before = _rows("runs_checkpoint", "run_id, visit, step, state::text")
    assert len(checkpoints_before) == 4
    entries_before = _rows("runs_logentry", "run_id, log, index, visit, value::text")

    _migrate(AFTER)
    assert _primary_key("runs_checkpoint") == ["run_id", "visit"]
    assert _primary_key("runs_logentry") == ["run_id", "log", "index"]
    assert _rows("runs_checkpoint", "run_id, visit, step, state::text") == checkpoints_before
    assert _rows("runs_logentry", "run_id, log, index, visit, value::text") == entries_before

    # the engine writes and reads through the new keys
    run = finished(start("chatter", input={"steps": 3}).id)
    assert list(Checkpoint.objects.filter(run=run).order_by("visit")
                .values_list("visit", flat=True)) == [0, 1, 2, 3, 4]
    assert Checkpoint.objects.get(pk=(run.id, 4)).step is None
    assert LogEntry.objects.filter(run=run).count() == 3

    _migrate(BEFORE)  # and back: the ids are drawn again, the unique constraints are back
    assert _primary_key("runs_checkpoint") == ["id"]
    assert len(_rows("runs_checkpoint", "id")) == len(checkpoints_before) + 5
    _migrate(AFTER)


def test_the_natural_key_refuses_a_second_checkpoint_or_log_entry_at_one_place(in_acme):
    run = finished(start("chatter", input={"steps": 2}).id)
    latest = Checkpoint.objects.filter(run=run).order_by("-visit").first()
    with pytest.raises(IntegrityError), transaction.atomic():
        Checkpoint.objects.create(run=run, visit=latest.visit, step=None, state={},
                                  log_offsets={}, agent_version=1, topology_hash="x")
    entry = LogEntry.objects.filter(run=run).first()
    with pytest.raises(IntegrityError), transaction.atomic():
        LogEntry.objects.create(run=run, log=entry.log, index=entry.index, visit=9, value={})
    assert Checkpoint.objects.filter(run=run).count() == 4
