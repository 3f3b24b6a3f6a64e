"""A hot path's statement sent to psycopg itself on Django's connection, as a server-side
prepared statement: planned once per connection, with no query building by the ORM and no
`SET LOCAL search_path` before it, so its tables are schema-qualified (decision 0022).
DATABASE_PREPARED_STATEMENTS=0 prepares nothing: psycopg then sends it unprepared, for a
pooler that cannot carry prepared statements."""

from collections.abc import Sequence
from typing import Any

import psycopg
from django.db import DEFAULT_DB_ALIAS, connections
from psycopg.pq import ExecStatus


def prepared_row(sql: str, params: Sequence[Any]) -> tuple | None:
    """Execute `sql`, in the caller's transaction if there is one; its first row, if it returns
    rows. Django's health check runs first, as before its own cursors' first statement: this
    may be a request's first (the API key's), or a task's (the claim)."""
    db = connections[DEFAULT_DB_ALIAS]  # one lookup, not one per attribute through the proxy
    db.close_if_health_check_failed()
    db.ensure_connection()
    cursor = _cursor(db)
    with db.wrap_database_errors:
        cursor.execute(sql, params, prepare=True)  # psycopg errors become Django's
        # (not `cursor.description`, which builds a Column per column to say the same)
        return cursor.fetchone() if cursor.pgresult.status == ExecStatus.TUPLES_OK else None


def _cursor(db) -> psycopg.Cursor:
    """The connection's cursor for these statements, made once per psycopg connection: making
    one (its adapters' map, its transformer) cost a step's statement 10-15 µs of client CPU
    (docs/benchmarks.md, 2026-12-07). A Django connection belongs to one thread, and so does
    the cursor kept on it; a reconnect makes a new one."""
    cursor = getattr(db, "_prepared_cursor", None)
    if cursor is None or cursor.connection is not db.connection or cursor.closed:
        cursor = db._prepared_cursor = psycopg.Cursor(db.connection)
    return cursor
