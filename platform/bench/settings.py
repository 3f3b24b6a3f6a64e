"""Settings for `python -m bench`: the project's settings, on a database of the benchmarks' own.

The database is dropped and made anew by each benchmark, so it is assigned here (from
BENCH_DATABASE_URL), never taken from a developer's DATABASE_URL.
"""

import base64
import os
import secrets

os.environ["DATABASE_URL"] = os.environ["DATABASE_DIRECT_URL"] = os.environ.get(
    "BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/agentplatform_bench"
)
# BENCH_POOLER_URL (postgres://user@host:port of a transaction pool, e.g. deploy/pgbouncer):
# the benchmark's processes reach the same database through it; making and dropping it and the
# session locks go to PostgreSQL itself (DATABASE_DIRECT_URL).
if os.environ.get("BENCH_POOLER_URL"):
    os.environ["DATABASE_URL"] = (os.environ["BENCH_POOLER_URL"].rstrip("/") + "/"
                                  + os.environ["DATABASE_DIRECT_URL"].rsplit("/", 1)[1])
    os.environ.setdefault("DATABASE_POOL_MODE", "transaction")
    os.environ.setdefault("DATABASE_PREPARED_STATEMENTS", "0")  # 1 with PgBouncer 1.21+
os.environ.setdefault("DJANGO_SECRET_KEY", secrets.token_urlsafe(40))
os.environ.setdefault("AGENTPLATFORM_MASTER_KEY", base64.b64encode(os.urandom(32)).decode())
os.environ.setdefault("LOG_LEVEL", "WARNING")
# The benchmarks' web servers are runserver on loopback, plain http (as deploy/dev's): without
# this, DEBUG off means production's https redirect and every request is a 301.
os.environ.setdefault("DJANGO_SECURE_SSL_REDIRECT", "0")

from agentplatform.settings import *  # noqa: E402,F403

DEBUG = False  # DEBUG keeps every query in memory: it would be measured too
