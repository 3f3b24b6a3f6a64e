"""Checkpoints and log entries keyed on their natural keys, (run, visit) and (run, log, index):
a step's inserts maintain one index each instead of two (docs/benchmarks.md, 2026-12-06).

An expand step, safe in a rolling deploy (migrate first, then restart workers host by host):
the `id` columns stay, filled by their identity default, so a worker still on the previous
code, which reads `id` and inserts with `RETURNING id`, goes on working; only the primary key
moves. Nothing in this code names `id` (the models' state has a `CompositePrimaryKey`); a
later release drops the columns (catalog-only, once no process reads them).

No table with rows is locked for more than a catalog change: the new unique index is built
CONCURRENTLY (writers go on; an invalid one left by an interrupted build is rebuilt), then
one short transaction, bounded by `lock_timeout` and retried, drops the old keys and makes
that index the primary key (`USING INDEX`, no scan). An empty table (a new tenant's) gets
its index in that transaction instead. Django 5.2 does not migrate an existing
primary key to a `CompositePrimaryKey`, hence SQL with the state alongside."""

from django.db import migrations, models

from agentplatform.online_ddl import (briefly_locked, concurrently, index_valid, statements_run,
                                      table_empty)

# table, its natural key, the unique constraint that stood for it
KEYS = [
    ("runs_checkpoint", "run_id, visit", "checkpoint_run_visit_unique"),
    ("runs_logentry", "run_id, log, index", "log_entry_unique"),
]


def _index_concurrently(connection, cursor, schema: str, name: str, table: str,
                        columns: str) -> None:
    """A valid unique index `name` on `table (columns)`, built without blocking writers."""
    valid = index_valid(cursor, schema, name)
    if valid:
        return
    how = concurrently(connection)
    if valid is not None:  # an interrupted concurrent build leaves an invalid index behind
        cursor.execute(f'DROP INDEX {how} "{schema}".{name}')
    cursor.execute(f'CREATE UNIQUE INDEX {how} {name} ON "{schema}".{table} ({columns})')


def _indexed(connection, schema: str, name: str, table: str, columns: str) -> list[str]:
    """A unique index `name` for the swap: built CONCURRENTLY now if the table has rows (its
    writers go on meanwhile), else (a new tenant's schema) built by the swap's transaction,
    which then waits on nothing but the table: a concurrent build waits for every older
    transaction in the database. Returns what the swap runs first."""
    with connection.cursor() as cursor:
        if table_empty(cursor, schema, table):
            return [f'CREATE UNIQUE INDEX IF NOT EXISTS {name} ON "{schema}".{table} ({columns})']
        _index_concurrently(connection, cursor, schema, name, table, columns)
    return []


def _swap(connection, statements: list[str]) -> None:
    """`statements` in one short transaction, bounded by `lock_timeout` and retried."""
    briefly_locked(connection, lambda cursor: statements_run(cursor, statements))


def _swapped(cursor, schema: str, table: str, unique: str) -> bool:
    """Whether `table` is keyed on its natural key already: its old unique constraint is gone
    (a run of this migration stopped between the two tables, then run again)."""
    cursor.execute("SELECT NOT EXISTS (SELECT FROM pg_constraint WHERE conrelid = %s::regclass "
                   "AND conname = %s)", [f'"{schema}".{table}', unique])
    return cursor.fetchone()[0]


def forward(apps, schema_editor) -> None:
    connection = schema_editor.connection
    schema = connection.schema_name
    for table, columns, unique in KEYS:
        with connection.cursor() as cursor:
            if _swapped(cursor, schema, table, unique):
                continue
            for leftover in (f"{table}_id", f"{unique}_idx"):  # of a reverse run that stopped
                if index_valid(cursor, schema, leftover) is not None:
                    cursor.execute(f'DROP INDEX {concurrently(connection)} "{schema}".{leftover}')
        first = _indexed(connection, schema, f"{table}_natural", table, columns)
        _swap(connection, [*first,
            f'ALTER TABLE "{schema}".{table} DROP CONSTRAINT {table}_pkey, '
            f"DROP CONSTRAINT {unique}",
            f'ALTER TABLE "{schema}".{table} ADD CONSTRAINT {table}_pkey PRIMARY KEY '
            f"USING INDEX {table}_natural",
        ])


def backward(apps, schema_editor) -> None:
    connection = schema_editor.connection
    schema = connection.schema_name
    for table, columns, unique in KEYS:
        with connection.cursor() as cursor:
            if not _swapped(cursor, schema, table, unique):
                continue
        first = [*_indexed(connection, schema, f"{table}_id", table, "id"),
                 *_indexed(connection, schema, f"{unique}_idx", table, columns)]
        _swap(connection, [*first,
            f'ALTER TABLE "{schema}".{table} DROP CONSTRAINT {table}_pkey',
            f'ALTER TABLE "{schema}".{table} ADD CONSTRAINT {table}_pkey PRIMARY KEY '
            f"USING INDEX {table}_id, ADD CONSTRAINT {unique} UNIQUE USING INDEX {unique}_idx",
        ])


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY runs outside a transaction
    dependencies = [("runs", "0009_state_rules")]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(forward, backward)],
            state_operations=[
                migrations.RemoveConstraint(model_name="checkpoint",
                                            name="checkpoint_run_visit_unique"),
                migrations.RemoveConstraint(model_name="logentry", name="log_entry_unique"),
                migrations.RemoveField(model_name="checkpoint", name="id"),
                migrations.RemoveField(model_name="logentry", name="id"),
                migrations.AddField(
                    model_name="checkpoint", name="pk",
                    field=models.CompositePrimaryKey("run_id", "visit", blank=True,
                                                     editable=False, primary_key=True,
                                                     serialize=False)),
                migrations.AddField(
                    model_name="logentry", name="pk",
                    field=models.CompositePrimaryKey("run_id", "log", "index", blank=True,
                                                     editable=False, primary_key=True,
                                                     serialize=False)),
            ],
        ),
    ]
