"""Checkpoints and log entries lose their foreign keys to the run in the database: every writer
holds the run's row in its own transaction instead, and the keys' checks cost each step ~8% of
its time (docs/decisions/0027-history-held-by-run.md, runs/models.py HISTORY_HELD_BY_RUN).

Dropping a foreign key is a catalog change, but it takes an ACCESS EXCLUSIVE lock on both
tables, the run table included: each drop waits at most LOCK_TIMEOUT for it (behind a long
transaction, queued writers would wait on the migration), and is retried. Safe in a rolling
deploy: a worker on the previous code writes the same rows. Backward adds the keys again
NOT VALID (a catalog change) and validates them after, which locks no writer out."""

import time

from django.db import OperationalError, migrations, models, transaction

TABLES = ("runs_checkpoint", "runs_logentry")
RUNS = "runs_run"
LOCK_TIMEOUT, ATTEMPTS = "3s", 20
LOCK_NOT_AVAILABLE = "55P03"  # lock_timeout expired


def _keys(cursor, schema: str, table: str) -> list[str]:
    """The foreign keys from `table` to the run table."""
    cursor.execute("SELECT conname FROM pg_constraint WHERE contype = 'f' "
                   "AND conrelid = %s::regclass AND confrelid = %s::regclass",
                   [f'"{schema}".{table}', f'"{schema}".{RUNS}'])
    return [name for (name,) in cursor.fetchall()]


def _briefly(connection, statement: str) -> None:
    """`statement` in a transaction of its own that waits at most LOCK_TIMEOUT for its locks,
    retried; inside a caller's transaction (a new tenant's schema), in that one."""
    for attempt in range(1, ATTEMPTS + 1):
        try:
            with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
                cursor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
                cursor.execute(statement)
            return
        except OperationalError as exc:
            if getattr(exc.__cause__, "sqlstate", None) != LOCK_NOT_AVAILABLE \
                    or attempt == ATTEMPTS or connection.in_atomic_block:
                raise
            time.sleep(min(attempt, 5))


def forward(apps, schema_editor) -> None:
    connection = schema_editor.connection
    schema = connection.schema_name
    for table in TABLES:
        with connection.cursor() as cursor:
            names = _keys(cursor, schema, table)
        for name in names:
            _briefly(connection, f'ALTER TABLE "{schema}".{table} DROP CONSTRAINT "{name}"')


def backward(apps, schema_editor) -> None:
    connection = schema_editor.connection
    schema = connection.schema_name
    for table in TABLES:
        name = f"{table}_run_id_fk_{RUNS}_id"
        with connection.cursor() as cursor:
            if _keys(cursor, schema, table):
                continue
        _briefly(connection, f'ALTER TABLE "{schema}".{table} ADD CONSTRAINT "{name}" '
                             f'FOREIGN KEY (run_id) REFERENCES "{schema}".{RUNS} (id) '
                             "DEFERRABLE INITIALLY DEFERRED NOT VALID")
        with connection.cursor() as cursor:  # a scan, under a lock that blocks no writer
            cursor.execute(f'ALTER TABLE "{schema}".{table} VALIDATE CONSTRAINT "{name}"')


class Migration(migrations.Migration):
    atomic = False  # a transaction per drop, each short
    dependencies = [("runs", "0010_natural_keys")]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(forward, backward)],
            state_operations=[
                migrations.AlterField(
                    model_name="checkpoint", name="run",
                    field=models.ForeignKey(db_constraint=False, db_index=False,
                                            on_delete=models.deletion.CASCADE,
                                            related_name="checkpoints", to="runs.run")),
                migrations.AlterField(
                    model_name="logentry", name="run",
                    field=models.ForeignKey(db_constraint=False, db_index=False,
                                            on_delete=models.deletion.CASCADE,
                                            related_name="log_entries", to="runs.run")),
            ],
        ),
    ]
