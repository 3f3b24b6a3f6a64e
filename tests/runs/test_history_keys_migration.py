"""Migration 0011 drops the foreign keys from checkpoints and log entries to their run (each
writer holds the run's row instead: runs/models.py HISTORY_HELD_BY_RUN); back, they are added
again and validated against the rows written meanwhile, and refuse an orphan again."""

import uuid

import pytest
from django.db import IntegrityError, connection, transaction
from django.db.migrations.executor import MigrationExecutor

from runs.models import Checkpoint
from tenants.services import tenant_create, tenant_delete
from tests.support.runs import finished, start

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


@pytest.fixture
def in_fresh_tenant(s3):
    tenant = tenant_create(schema_name=f"histkeys{uuid.uuid4().hex[:8]}").tenant
    try:
        connection.set_tenant(tenant)
        yield tenant
    finally:
        connection.set_schema_to_public()
        tenant_delete(tenant=tenant)


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
