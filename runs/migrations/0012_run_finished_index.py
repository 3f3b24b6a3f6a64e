"""An index on finished runs by (finished_at, id), for the retention pass's pick of the runs due
(runs/retention/selectors.py `runs_due`): it reads them oldest first and stops at its batch,
where without it each pass sorted every finished run of the tenant.

Built CONCURRENTLY, so the tenant's writers (a run's claim and end update its row) are not held
for the length of the build; a build that failed leaves an INVALID index, which is dropped and
built again. Inside a caller's transaction (a new tenant's schema, its tables just made and
empty), where CONCURRENTLY is refused, it is built as is."""

from django.db import migrations, models

NAME, TABLE = "runs_run_finished_idx", "runs_run"


def _concurrently(connection) -> str:
    return "" if connection.in_atomic_block else "CONCURRENTLY"


def forward(apps, schema_editor) -> None:
    connection = schema_editor.connection
    schema = connection.schema_name
    with connection.cursor() as cursor:
        cursor.execute("SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
                       "JOIN pg_namespace n ON n.oid = c.relnamespace "
                       "WHERE n.nspname = %s AND c.relname = %s", [schema, NAME])
        row = cursor.fetchone()
        if row and row[0]:
            return
        if row:  # an interrupted concurrent build
            cursor.execute(f'DROP INDEX {_concurrently(connection)} "{schema}".{NAME}')
        cursor.execute(f'CREATE INDEX {_concurrently(connection)} {NAME} ON "{schema}".{TABLE} '
                       "(finished_at, id) WHERE finished_at IS NOT NULL")


def backward(apps, schema_editor) -> None:
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        cursor.execute(f'DROP INDEX {_concurrently(connection)} IF EXISTS '
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
