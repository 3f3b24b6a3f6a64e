"""The backend's table list names the selected schema instead of asking pg_table_is_visible of
every relation in the database (which made migrate_schemas grow with the square of the number
of tenants): it must still be exactly the list Django's own query gives with that schema alone
on the search path."""

from django.db import connection
from django.db.backends.postgresql.introspection import DatabaseIntrospection
from django_tenants.utils import schema_context


def stock_table_list(cursor) -> list:
    with connection.introspection._schema_only(cursor):
        return DatabaseIntrospection.get_table_list(connection.introspection, cursor)


def test_the_table_list_of_each_schema_is_djangos_own_for_it_alone(acme, globex):
    for schema in ("public", acme.schema_name, globex.schema_name):
        with schema_context(schema), connection.cursor() as cursor:
            ours = connection.introspection.get_table_list(cursor)
            assert sorted(ours) == sorted(stock_table_list(cursor)), schema
            names = {table.name for table in ours}
            assert "django_migrations" in names
            assert ("runs_run" in names) == (schema != "public"), schema  # a tenant's own
            assert ("tenants_tenant" in names) == (schema == "public"), schema


def test_a_schema_with_a_quoted_name_is_found(acme):
    with connection.cursor() as cursor:
        cursor.execute('CREATE SCHEMA IF NOT EXISTS "Odd-Name"')
        cursor.execute('CREATE TABLE IF NOT EXISTS "Odd-Name".t (id int)')
    try:
        with schema_context("Odd-Name"), connection.cursor() as cursor:
            assert [t.name for t in connection.introspection.get_table_list(cursor)] == ["t"]
    finally:
        with connection.cursor() as cursor:
            cursor.execute('DROP SCHEMA "Odd-Name" CASCADE')
