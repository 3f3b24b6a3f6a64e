"""django-tenants' PostgreSQL backend with the tenant's schema selected inside every statement's
own transaction, so that it holds behind a transaction pool (docs/decisions/0022).

django-tenants sends `SET search_path` as a statement of its own, a session setting: behind
PgBouncer in transaction mode that statement and the query that follows it may run on two
different server connections, and the setting stays on the first for whichever client borrows
it next. Here each statement carries `SET LOCAL search_path` in the same message (one round
trip): outside a transaction the two run as one implicit transaction, inside one the setting
lasts until it ends. Nothing session-wide is ever left on a server connection.
"""

import re
import select
from contextlib import contextmanager

import psycopg
from django.core.exceptions import ImproperlyConfigured
from django.db.backends.postgresql.base import Cursor
from django.db.backends.postgresql.introspection import DatabaseIntrospection, TableInfo
from django_tenants.postgresql_backend.base import DatabaseWrapper as TenantsDatabaseWrapper
from django_tenants.utils import quote_schema_name
from psycopg import pq, sql

# Statements PostgreSQL refuses inside a transaction block (an implicit one included).
# They get django-tenants' session setting instead: right straight to PostgreSQL only.
NOT_IN_A_TRANSACTION = re.compile(
    r"\s*(VACUUM|(CREATE|DROP)\s+(DATABASE|TABLESPACE)|ALTER\s+SYSTEM"
    r"|(CREATE\s+(UNIQUE\s+)?|DROP\s+)INDEX\s+CONCURRENTLY"
    r"|REINDEX\s+(\(.*?\)\s*)?(SYSTEM|DATABASE|\w+\s+CONCURRENTLY))",
    re.IGNORECASE)


TRANSACTION_CONTROL = re.compile(
    r"\s*(SAVEPOINT|ROLLBACK|RELEASE|BEGIN|COMMIT|START\s+TRANSACTION)\b", re.IGNORECASE)


class SchemaCursor(Cursor):
    """Django's psycopg cursor (client-side binding, so a statement goes in one simple-protocol
    message) that runs each statement after `search_path`, the connection's `SET LOCAL`."""

    search_path = ""

    def execute(self, query, params=None, **kwargs):
        if not self.search_path or self._transaction_control(query):
            # ROLLBACK TO SAVEPOINT in an aborted transaction must run alone: prefixed, the
            # SET would be refused first and the transaction would stay aborted
            return super().execute(query, params, **kwargs)
        if self._outside_transactions(query):
            if self.search_path:
                super().execute(self.search_path.replace("SET LOCAL", "SET", 1))
            return super().execute(query, params, **kwargs)
        prefix = self.search_path + "; "
        if params is not None:  # the text is a template: its % are placeholders
            prefix = prefix.replace("%", "%%")
        if isinstance(query, sql.Composable):
            query = sql.SQL(prefix) + query
        elif isinstance(query, bytes):
            query = prefix.encode() + query
        else:
            query = prefix + query
        super().execute(query, params, **kwargs)
        self.nextset()  # the statement's own result, not the SET's
        return self

    def executemany(self, query, params_seq, **kwargs):
        if not self.search_path:
            return super().executemany(query, params_seq, **kwargs)
        if self.connection.autocommit:
            with self.connection.transaction():
                super().execute(self.search_path)
                return super().executemany(query, params_seq, **kwargs)
        super().execute(self.search_path)
        return super().executemany(query, params_seq, **kwargs)

    @staticmethod
    def _transaction_control(query) -> bool:
        text = query.decode() if isinstance(query, bytes) else query
        return isinstance(text, str) and TRANSACTION_CONTROL.match(text) is not None

    @staticmethod
    def _outside_transactions(query) -> bool:
        text = query.decode() if isinstance(query, bytes) else query
        return isinstance(text, str) and NOT_IN_A_TRANSACTION.match(text) is not None


class SchemaIntrospection(DatabaseIntrospection):
    """Tables of the selected schema only, as django-tenants' introspection finds them, without
    its session `SET search_path` round trips: the statements run with the schema alone.

    The table list reads the schema's own relations through pg_depend's index instead of
    asking `pg_table_is_visible` of every relation in the database: with 2,000 tenant schemas
    (290,000 relations) that took 0.2 to 1.4 s per call, against 9 to 15 ms, a few calls per
    schema's migrate, so `migrate_schemas` grew with the square of the tenants
    (docs/benchmarks.md, tenants)."""

    @contextmanager
    def _schema_only(self, cursor):
        raw = getattr(cursor, "cursor", cursor)  # under Django's CursorWrapper
        saved = raw.search_path
        raw.search_path = f"SET LOCAL search_path = {quote_schema_name(self.connection.schema_name)}"
        try:
            yield
        finally:
            raw.search_path = saved

    def get_table_list(self, cursor):
        # The relations that depend on the schema (pg_depend's index on the referenced
        # object: as many rows as the schema holds), not a scan of all of pg_class
        cursor.execute("""
            SELECT c.relname,
                   CASE WHEN c.relispartition THEN 'p'
                        WHEN c.relkind IN ('m', 'v') THEN 'v'
                        ELSE 't' END,
                   obj_description(c.oid, 'pg_class')
              FROM pg_catalog.pg_depend d
              JOIN pg_catalog.pg_class c ON c.oid = d.objid
             WHERE d.refclassid = 'pg_catalog.pg_namespace'::regclass
               AND d.refobjid = to_regnamespace(%s)
               AND d.classid = 'pg_catalog.pg_class'::regclass AND d.deptype = 'n'
               AND c.relkind IN ('f', 'm', 'p', 'r', 'v')""",
                       [quote_schema_name(self.connection.schema_name)])
        return [TableInfo(*row) for row in cursor.fetchall() if row[0] not in self.ignored_tables]

    def get_table_description(self, cursor, table_name):
        with self._schema_only(cursor):
            return super().get_table_description(cursor, table_name)

    def get_sequences(self, cursor, table_name, table_fields=()):
        with self._schema_only(cursor):
            return super().get_sequences(cursor, table_name, table_fields)

    def get_relations(self, cursor, table_name):
        with self._schema_only(cursor):
            return super().get_relations(cursor, table_name)

    def get_constraints(self, cursor, table_name):
        with self._schema_only(cursor):
            return super().get_constraints(cursor, table_name)


def needs_round_trip(conn: psycopg.Connection) -> bool:
    """Whether only a statement can tell if the connection still works. An idle connection
    that the server closed (a restart, `pg_terminate_backend`, an idle timeout, a pooler's)
    has its socket readable: its last message, or end of file, is waiting there. An idle
    connection with nothing to read is used as is. What this cannot see is a peer gone without
    a word (a NAT or balancer that dropped the flow): where `SELECT 1` would have failed and
    been replaced, the request's or task's first statement fails instead, and Django closes
    the connection after it (at most once per connection, within CONN_MAX_AGE)."""
    if conn.closed:
        return True
    if conn.info.transaction_status != pq.TransactionStatus.IDLE:
        return True
    try:
        readable, _, _ = select.select([conn.fileno()], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


class DatabaseWrapper(TenantsDatabaseWrapper):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.introspection = SchemaIntrospection(self)

    def get_connection_params(self):
        params = super().get_connection_params()
        params["cursor_factory"] = SchemaCursor
        return params

    def is_usable(self):
        """Django's health check (CONN_HEALTH_CHECKS: before the first query of each request
        and task) without its `SELECT 1` when nothing is amiss (`needs_round_trip`). The check
        was a transaction and a round trip per request and per task: five per run in `bench
        throughput` (docs/benchmarks.md)."""
        conn = self.connection
        if conn is None or conn.closed:
            return False
        return not needs_round_trip(conn) or super().is_usable()

    def _cursor(self, name=None):
        if name:  # a server-side cursor: django-tenants' session setting (never behind a
            return super()._cursor(name)  # transaction pool: DISABLE_SERVER_SIDE_CURSORS there)
        if not self.schema_name:
            raise ImproperlyConfigured("Database schema not set. Did you forget to call "
                                       "set_schema() or set_tenant()?")
        cursor = super(TenantsDatabaseWrapper, self)._cursor()
        paths = ", ".join(quote_schema_name(path) for path in self._get_cursor_search_paths())
        cursor.cursor.search_path = f"SET LOCAL search_path = {paths}"  # under Django's wrapper
        return cursor
