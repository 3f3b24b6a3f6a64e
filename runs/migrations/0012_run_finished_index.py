"""An index on finished runs by (finished_at, id), for the retention pass's pick of the runs due
(runs/retention/selectors.py `runs_due`): it reads them oldest first and stops at its batch,
where without it each pass sorted every finished run of the tenant.

Built CONCURRENTLY on a table with rows, so the tenant's writers (a run's claim and end update
its row) are not held for the length of the build (agentplatform.online_ddl). Safe in a
rolling deploy: the previous code reads runs as before, and the index only serves it."""

from django.db import migrations, models

from agentplatform.online_ddl import concurrently, index_build

NAME, TABLE = "runs_run_finished_idx", "runs_run"


def forward(apps, schema_editor) -> None:
    connection = schema_editor.connection
    index_build(connection, schema=connection.schema_name, table=TABLE, name=NAME,
                columns="finished_at, id", where="finished_at IS NOT NULL")


def backward(apps, schema_editor) -> None:
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        cursor.execute(f'DROP INDEX {concurrently(connection)} IF EXISTS '
                       f'"{connection.schema_name}".{NAME}')


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY runs outside a transaction
    dependencies = [("runs", "0011_history_held_by_run")]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(forward, backward)],
            state_operations=[migrations.AddIndex(
                model_name="run",
                index=models.Index(condition=models.Q(finished_at__isnull=False),
                                   fields=["finished_at", "id"], name=NAME))],
        ),
    ]
