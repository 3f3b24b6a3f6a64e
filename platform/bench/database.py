"""The benchmarks' databases: made anew on the PostgreSQL server the settings point at.

Only databases whose name contains "bench" are ever dropped here.
"""

import os

import psycopg
from django.conf import settings
from django.core.management import call_command


def slot_environment(bench: str) -> int:
    """A bench's own database (`agentplatform_bench_<bench><slot>`) and Redis db, by BENCH_SLOT
    (else TEST_SLOT), set in the environment its processes inherit, before Django starts. Test
    slots use Redis dbs 15..8 and the other benchmarks 13: the benches that start workers take
    1..7 by slot (run one of them per slot at a time). Returns the slot."""
    slot = int(os.environ.setdefault("BENCH_SLOT", os.environ.get("TEST_SLOT", "0")))
    os.environ.setdefault("BENCH_DATABASE_URL",
                          f"postgres://postgres@127.0.0.1:5432/agentplatform_bench_{bench}{slot}")
    os.environ.setdefault("BENCH_REDIS_URL", f"redis://127.0.0.1:6379/{1 + slot % 7}")
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    return slot


def server_dsn(dbname: str) -> str:
    """A libpq connection string for `dbname` on the PostgreSQL server of Django's default
    database (itself, not a pooler in front of it: DATABASE_DIRECT)."""
    db = settings.DATABASE_DIRECT
    parts = {"host": db["HOST"] or "127.0.0.1", "port": db["PORT"] or 5432,
             "user": db["USER"] or "postgres", "password": db["PASSWORD"], "dbname": dbname}
    return " ".join(f"{k}={v}" for k, v in parts.items() if v)


def server_url(dbname: str) -> str:
    """The same as a URL (for clients that take only URLs)."""
    db = settings.DATABASE_DIRECT
    auth = db["USER"] or "postgres"
    if db["PASSWORD"]:
        auth += f":{db['PASSWORD']}"
    return f"postgresql://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{dbname}"


def _refuse_unless_bench(name: str) -> None:
    if "bench" not in name:
        raise ValueError(f"refusing to drop {name!r}: benchmark databases have 'bench' in their name")


def database_recreate(name: str) -> None:
    _refuse_unless_bench(name)
    with psycopg.connect(server_dsn("postgres"), autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                      "WHERE datname = %s AND pid <> pg_backend_pid()", [name])
        admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        admin.execute(f'CREATE DATABASE "{name}"')


def database_drop(name: str) -> None:
    _refuse_unless_bench(name)
    with psycopg.connect(server_dsn("postgres"), autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                      "WHERE datname = %s AND pid <> pg_backend_pid()", [name])
        admin.execute(f'DROP DATABASE IF EXISTS "{name}"')


def bench_database_prepare() -> None:
    """Make the settings' database anew and migrate its shared (public) schema."""
    from django.db import connections

    connections.close_all()
    database_recreate(settings.DATABASES["default"]["NAME"])
    call_command("migrate_schemas", shared=True, interactive=False, verbosity=0)
