"""New rows of several models written in one statement: each row's INSERT as the ORM compiles
it for `Model.objects.create` (its defaults and `auto_now_add` applied), the INSERTs joined as
data-modifying CTEs, so N rows cost one round trip and one statement instead of N. The
statement runs in the caller's transaction; a row's foreign key may name a row of the same
statement (Django's foreign keys are checked at commit)."""

from django.db import connection
from django.db.models import Model
from django.db.models.sql import InsertQuery


def rows_insert(*rows: Model) -> None:
    """INSERT `rows`, in order, in one statement, on the default database. A key the database
    draws (an AutoField left None) is not read back: such a row stays unsaved as far as Django
    knows (do not save it again: that would be a second row); a row with its key set in Python
    is saved (a later `save()` is an UPDATE). A value the database computes (a `db_default`
    without a Python default) is not read back either."""
    parts, params = [], []
    for number, row in enumerate(rows):
        meta = row._meta
        fields = [field for field in meta.local_concrete_fields if not field.generated
                  and not (field is meta.auto_field and getattr(row, field.attname) is None)]
        query = InsertQuery(type(row))
        query.insert_values(fields, [row])
        [(sql, values)] = query.get_compiler(connection=connection).as_sql()
        parts.append(f"row{number} AS ({sql})")
        params.extend(values)
    with connection.cursor() as cursor:
        cursor.execute(f"WITH {', '.join(parts)} SELECT 1", params)
    for row in rows:
        if row.pk is not None:
            row._state.adding, row._state.db = False, connection.alias
