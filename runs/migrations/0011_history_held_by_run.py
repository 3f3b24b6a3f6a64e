"""Checkpoints and log entries lose their foreign keys to the run in the database: every writer
holds the run's row in its own transaction instead, and the keys' checks cost each step ~8% of
its time (docs/decisions/0027-history-held-by-run.md, runs/models.py HISTORY_HELD_BY_RUN).

Dropping (or adding) a foreign key is a catalog change, but it locks both tables, the run table
included. One short transaction takes those locks first, in the order the writers take them
(the run table, then the history tables: a writer that holds a run's row and then inserts its
checkpoint would otherwise deadlock with it), waits at most LOCK_TIMEOUT for them (behind a
long transaction, queued writers would wait on the migration), and is retried on a timeout or
a deadlock. Inside a caller's transaction (a new tenant's schema, its tables just made and
empty) it runs once, as is. Safe in a rolling deploy: a worker on the previous code writes the
same rows, and its prepared statements are planned again. Backward adds the keys NOT VALID,
then validates each one not valid yet (a scan that locks out no writer), so a run interrupted
between the two finishes the next time."""

from django.db import migrations, models

from agentplatform.online_ddl import briefly_locked

TABLES = ("runs_checkpoint", "runs_logentry")
RUNS = "runs_run"


def _keys(cursor, schema: str, table: str) -> dict[str, bool]:
    """The foreign keys from `table` to the run table, each with whether it is validated."""
    cursor.execute("SELECT conname, convalidated FROM pg_constraint WHERE contype = 'f' "
                   "AND conrelid = %s::regclass AND confrelid = %s::regclass",
                   [f'"{schema}".{table}', f'"{schema}".{RUNS}'])
    return dict(cursor.fetchall())


def _locked(connection, schema: str, statements) -> None:
    """`statements(cursor)` in a short transaction (`briefly_locked`) that first locks the run
    table, then the history tables: the order the writers take them in."""
    tables = ", ".join(f'"{schema}".{table}' for table in (RUNS, *TABLES))

    def run(cursor):
        cursor.execute(f"LOCK TABLE {tables} IN ACCESS EXCLUSIVE MODE")
        statements(cursor)

    briefly_locked(connection, run)


def forward(apps, schema_editor) -> None:
    connection = schema_editor.connection
    schema = connection.schema_name

    def drop(cursor):
        for table in TABLES:
            for name in _keys(cursor, schema, table):
                cursor.execute(f'ALTER TABLE "{schema}".{table} DROP CONSTRAINT "{name}"')

    _locked(connection, schema, drop)


def backward(apps, schema_editor) -> None:
    connection = schema_editor.connection
    schema = connection.schema_name

    def add(cursor):
        for table in TABLES:
            if not _keys(cursor, schema, table):
                cursor.execute(
                    f'ALTER TABLE "{schema}".{table} ADD CONSTRAINT "{table}_run_id_fk_{RUNS}_id" '
                    f'FOREIGN KEY (run_id) REFERENCES "{schema}".{RUNS} (id) '
                    "DEFERRABLE INITIALLY DEFERRED NOT VALID")

    _locked(connection, schema, add)
    for table in TABLES:
        with connection.cursor() as cursor:
            for name, valid in _keys(cursor, schema, table).items():
                if not valid:  # a scan, under a lock that blocks no writer
                    cursor.execute(f'ALTER TABLE "{schema}".{table} VALIDATE CONSTRAINT "{name}"')


class Migration(migrations.Migration):
    atomic = False  # one short transaction for the locks; the validation outside it
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
