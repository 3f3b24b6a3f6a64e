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


def test_every_kind_of_relation_in_a_schema_with_a_quoted_name_is_found(acme):
    with connection.cursor() as cursor:
        cursor.execute('DROP SCHEMA IF EXISTS "Odd-Name" CASCADE')
        cursor.execute('CREATE SCHEMA "Odd-Name"')
        cursor.execute('CREATE TABLE "Odd-Name".t (id int)')
        cursor.execute('CREATE VIEW "Odd-Name".v AS SELECT 1 AS one')
        cursor.execute('CREATE MATERIALIZED VIEW "Odd-Name".m AS SELECT 1 AS one')
        cursor.execute('CREATE TABLE "Odd-Name".p (id int) PARTITION BY RANGE (id)')
        cursor.execute('CREATE TABLE "Odd-Name".p1 PARTITION OF "Odd-Name".p '
                       'FOR VALUES FROM (0) TO (10)')
        cursor.execute('CREATE INDEX ON "Odd-Name".t (id)')  # not a table: not listed
    try:
        with schema_context("Odd-Name"), connection.cursor() as cursor:
            ours = connection.introspection.get_table_list(cursor)
            assert sorted(ours) == sorted(stock_table_list(cursor))
            assert sorted((t.name, t.type) for t in ours) == [
                ("m", "v"), ("p", "t"), ("p1", "p"), ("t", "t"), ("v", "v")]
    finally:
        with connection.cursor() as cursor:
            cursor.execute('DROP SCHEMA "Odd-Name" CASCADE')
