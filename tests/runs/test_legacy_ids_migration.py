"""Migration 0013 drops the `id` columns 0010 kept on checkpoints and log entries; back, they
are added again, each row with its own, as the code before 0010 read them."""

import uuid

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from runs.models import Checkpoint, LogEntry
from tenants.services import tenant_create, tenant_delete
from tests.support.runs import finished, start

BEFORE, AFTER = ("runs", "0012_run_finished_index"), ("runs", "0013_drop_legacy_ids")


def _migrate(target: tuple[str, str]) -> None:
    MigrationExecutor(connection).migrate([target])


def _ids() -> dict[str, tuple[int, int]]:
    """Each table with an `id` column: its rows, and how many distinct ids they hold."""
    found = {}
    with connection.cursor() as cursor:
        for table in ("runs_checkpoint", "runs_logentry"):
            cursor.execute("SELECT EXISTS (SELECT FROM information_schema.columns WHERE "
                           "table_schema = %s AND table_name = %s AND column_name = 'id')",
                           [connection.schema_name, table])
            if cursor.fetchone()[0]:
                cursor.execute(f"SELECT count(*), count(DISTINCT id) FROM {table}")
                found[table] = cursor.fetchone()
    return found


@pytest.fixture
def in_fresh_tenant(s3):
    tenant = tenant_create(schema_name=f"ids{uuid.uuid4().hex[:8]}").tenant
    try:
        connection.set_tenant(tenant)
        yield tenant
    finally:
        connection.set_schema_to_public()
        tenant_delete(tenant=tenant)


def test_the_ids_are_dropped_and_come_back_one_per_row(in_fresh_tenant):
    assert _ids() == {}
    run = finished(start("chatter", input={"steps": 2}).id)  # written without ids
    _migrate(BEFORE)
    assert _ids() == {"runs_checkpoint": (4, 4), "runs_logentry": (2, 2)}
    with connection.cursor() as cursor:  # drawn on insert, as the code before 0010 had them
        cursor.execute("INSERT INTO runs_logentry (run_id, log, index, visit, value) "
                       "VALUES (%s, 'messages', 2, 3, '{}') RETURNING id", [run.id])
        assert isinstance(cursor.fetchone()[0], int)
    _migrate(AFTER)
    assert _ids() == {}
    run = finished(start("chatter", input={"steps": 2}).id)  # the engine writes without them
    assert Checkpoint.objects.filter(run=run).count() == 4
    assert LogEntry.objects.filter(run=run).count() == 2
