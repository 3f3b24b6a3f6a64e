"""Indexes a migration builds on a tenant's live tables without holding its writers: CREATE
INDEX CONCURRENTLY, unless the migration runs inside a caller's transaction (django-tenants
migrates a new tenant's schema there, where CONCURRENTLY is refused), and an index an
interrupted concurrent build left INVALID is rebuilt. Names are qualified with the schema:
through a transaction pooler, a statement outside a transaction may reach a server connection
whose search_path is another tenant's."""


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
    rows; at once on an empty one (a new tenant's): a concurrent build waits for every older
    transaction in the database."""
    with connection.cursor() as cursor:
        valid = index_valid(cursor, schema, name)
        if valid:
            return
        how = "" if table_empty(cursor, schema, table) else concurrently(connection)
        if valid is not None:  # an interrupted concurrent build leaves an invalid index behind
            cursor.execute(f'DROP INDEX {how} "{schema}".{name}')
        cursor.execute(f'CREATE INDEX {how} {name} ON "{schema}".{table} ({columns})'
                       + (f" WHERE {where}" if where else ""))
