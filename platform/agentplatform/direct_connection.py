"""Connections straight to PostgreSQL (DATABASE_DIRECT_URL), for what a transaction pool cannot
carry: a session advisory lock held across transactions would stay on whichever server
connection took it, lent to other clients, and an unlock may reach another (docs/decisions/0022).
"""

import psycopg
from django.conf import settings


def direct_connect(**kwargs) -> psycopg.Connection:
    """An autocommit psycopg connection to PostgreSQL itself; `kwargs` are libpq's."""
    db = settings.DATABASE_DIRECT
    params = {"host": db["HOST"], "port": db["PORT"], "dbname": db["NAME"], "user": db["USER"],
              "password": db["PASSWORD"]}
    return psycopg.connect(**{k: v for k, v in params.items() if v}, autocommit=True, **kwargs)
