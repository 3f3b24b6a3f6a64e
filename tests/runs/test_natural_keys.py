"""Migration 0010 keys checkpoints and log entries on (run, visit) and (run, log, index): a
tenant schema holding runs from before migrates forward with every row kept, and back; a
worker still on the previous code (which reads `id` and inserts with `RETURNING id`) goes on
working in between (a rolling deploy); the natural key refuses a second row for one place."""


import pytest
from django.db import IntegrityError, connection, transaction
from django.db.migrations.executor import MigrationExecutor

from runs.models import Checkpoint, LogEntry
from tests.support.runs import finished, start
from tests.support.tenants import tenant_of_its_own

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
    with tenant_of_its_own("natkeys") as tenant:
        connection.set_tenant(tenant)
        yield tenant


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

    # the previous code's statements, as its ORM sent them: `id` read, `id` drawn on insert
    with connection.cursor() as cursor:
        cursor.execute("SELECT id, run_id, visit FROM runs_checkpoint WHERE run_id = %s "
                       "ORDER BY visit DESC LIMIT 1", [old.id])
        assert cursor.fetchone()[2] == 3
        cursor.execute("""INSERT INTO runs_checkpoint (run_id, visit, step, state, log_offsets,
                                 agent_version, topology_hash, created_at)
                          VALUES (%s, 4, NULL, '{}', '{}', 1, 'x', now()) RETURNING id""", [old.id])
        assert isinstance(cursor.fetchone()[0], int)
        cursor.execute("""INSERT INTO runs_logentry (run_id, log, index, visit, value)
                          VALUES (%s, 'messages', 2, 4, '{}') RETURNING id""", [old.id])
        assert isinstance(cursor.fetchone()[0], int)

    # the engine writes and reads through the new keys
    run = finished(start("chatter", input={"steps": 3}).id)
    assert list(Checkpoint.objects.filter(run=run).order_by("visit")
                .values_list("visit", flat=True)) == [0, 1, 2, 3, 4]
    assert Checkpoint.objects.get(pk=(run.id, 4)).step is None
    assert LogEntry.objects.filter(run=run).count() == 3

    checkpoints_now = _rows("runs_checkpoint", "id, run_id, visit, step, state::text")
    entries_now = _rows("runs_logentry", "id, run_id, log, index, visit, value::text")
    assert len(checkpoints_now) == 4 + 1 + 5 and len(entries_now) == 2 + 1 + 3
    _migrate(BEFORE)  # and back: keyed on `id` again (every row has its own), unique constraints
    assert _primary_key("runs_checkpoint") == ["id"]
    assert _primary_key("runs_logentry") == ["id"]
    assert _rows("runs_checkpoint", "id, run_id, visit, step, state::text") == checkpoints_now
    assert _rows("runs_logentry", "id, run_id, log, index, visit, value::text") == entries_now
    with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("INSERT INTO runs_checkpoint (run_id, visit, step, state, log_offsets, "
                       "agent_version, topology_hash, created_at) "
                       "VALUES (%s, 4, NULL, '{}', '{}', 1, 'x', now())", [old.id])
    _migrate(AFTER)
    assert _primary_key("runs_checkpoint") == ["run_id", "visit"]


def test_the_natural_key_refuses_a_second_checkpoint_or_log_entry_at_one_place(in_acme):
    run = finished(start("chatter", input={"steps": 2}).id)
    latest = Checkpoint.objects.filter(run=run).order_by("-visit").first()
    with pytest.raises(IntegrityError), transaction.atomic():
        Checkpoint.objects.create(run=run, visit=latest.visit, step=None, state={},
                                  log_offsets={}, agent_version=1, topology_hash="x")
    entry = LogEntry.objects.filter(run=run).first()
    with pytest.raises(IntegrityError), transaction.atomic():
        LogEntry.objects.create(run=run, log=entry.log, index=entry.index, visit=9, value={})
    # save() of a whole key inserts, never updates: not even while pruning is allowed, when
    # the append-only trigger would let an UPDATE pass (as a no-op)
    for row in (Checkpoint(run=run, visit=latest.visit, step="forged", state={}, log_offsets={},
                           agent_version=1, topology_hash="x"),
                LogEntry(run=run, log=entry.log, index=entry.index, visit=9, value="forged")):
        with pytest.raises(IntegrityError), transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL agentplatform.allow_prune = 'on'")
            row.save()
    assert LogEntry.objects.get(pk=(run.id, entry.log, entry.index)).value == entry.value
    assert Checkpoint.objects.filter(run=run).count() == 4
