"""Schema changes a migration makes on a tenant's live tables without stalling its writers.

An index is built CONCURRENTLY on a table with rows, unless the migration runs inside a
caller's transaction (django-tenants may migrate a new tenant's schema there, where
CONCURRENTLY is refused); an index an interrupted concurrent build left INVALID is rebuilt.
A catalog change that needs a table's exclusive lock (a key, a column dropped) is made in one
short transaction that waits at most LOCK_TIMEOUT for its locks and is retried: queued behind a
long transaction, it would hold every writer queued behind it. Names are qualified with the
schema: through a transaction pooler, a statement outside a transaction may reach a server
connection whose search_path is another tenant's.

Migrations 0010-0012 import these: a change here changes what they do, so keep each function's
effect as it is, or give a migration its own copy."""

import time
from collections.abc import Callable

from django.db import OperationalError, transaction

LOCK_TIMEOUT, ATTEMPTS = "3s", 20
RETRIED = {"55P03", "40P01"}  # lock_timeout expired; deadlock


def briefly_locked(connection, statements: Callable) -> None:
    """`statements(cursor)` in one transaction, each lock waited for at most LOCK_TIMEOUT,
    retried on a timeout or a deadlock. Inside a caller's transaction (a new tenant's schema,
    its tables just made and empty) it runs once, as is: SET LOCAL would outlive a savepoint."""
    own = not connection.in_atomic_block
    for attempt in range(1, ATTEMPTS + 1):
        try:
            with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
                if own:
                    cursor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
                statements(cursor)
            return
        except OperationalError as exc:
            if getattr(exc.__cause__, "sqlstate", None) not in RETRIED \
                    or attempt == ATTEMPTS or not own:
                raise
            time.sleep(min(attempt, 5))


def concurrently(connection) -> str:
    """CONCURRENTLY, unless a caller runs the migration inside its transaction."""
    return "" if connection.in_atomic_block else "CONCURRENTLY"


def index_valid(cursor, schema: str, name: str) -> bool | None:
    """Whether the index `name` is valid; None if there is none."""
    cursor.execute("SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
                   "WHERE c.relname = %s AND c.relnamespace = %s::regnamespace", [name, schema])
    found = cursor.fetchone()
    return None if found is None else found[0]


def table_empty(cursor, schema: str, table: str) -> bool:
    cursor.execute(f'SELECT NOT EXISTS (SELECT FROM "{schema}".{table})')
    return cursor.fetchone()[0]


def index_build(connection, *, schema: str, table: str, name: str, columns: str,
                where: str = "") -> None:
    """A valid index `name` on `table (columns)` [WHERE `where`]. Concurrently on a table with
    rows (an invalid one, left by an interrupted build, dropped first); at once on an empty one
    (a new tenant's), where a concurrent build would wait for every older transaction in the
    database, in a short transaction (`briefly_locked`)."""
    with connection.cursor() as cursor:
        valid = index_valid(cursor, schema, name)
        if valid:
            return
        empty = table_empty(cursor, schema, table)
    how = "" if empty else concurrently(connection)
    statements = [f'DROP INDEX {how} "{schema}".{name}'] if valid is not None else []
    statements.append(f'CREATE INDEX {how} {name} ON "{schema}".{table} ({columns})'
                      + (f" WHERE {where}" if where else ""))
    if empty:  # in a short transaction: behind a writer's open insert, it waits 3 s and retries
        briefly_locked(connection, lambda cursor: statements_run(cursor, statements))
    else:
        with connection.cursor() as cursor:
            statements_run(cursor, statements)


def statements_run(cursor, statements: list[str]) -> None:
    for statement in statements:
        cursor.execute(statement)
