"""Django's connection health check (CONN_HEALTH_CHECKS) without its round trip: a connection
that is fine is used as is, one the server closed is replaced before the first query uses it.

The backend's last statement is read from pg_stat_activity, from a connection of its own: a
`SELECT 1` health check would show there."""

import os
import time
import uuid

import pytest
from django.conf import settings
from django.db import connection, connections

from tenants.models import Tenant
from tenants.services import api_key_authenticate
from tests.support.runs import other_connection

pytestmark = pytest.mark.skipif(settings.DATABASE_POOL_MODE == "transaction",
                                reason="behind a transaction pool a backend is not the client's own")


def marked_backend() -> tuple[int, str]:
    """Run a statement that names itself on Django's connection: (backend pid, its text)."""
    marker = f"marker-{uuid.uuid4().hex}"
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT pg_backend_pid(), '{marker}'")
        pid = cursor.fetchone()[0]
    connection.close_at = None  # kept between requests, as CONN_MAX_AGE does in production
    return pid, marker


def last_statement(pid: int) -> str:
    with other_connection() as other:
        row = other.execute("SELECT query FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone()
        return row[0] if row else ""


def backend_terminate(pid: int) -> None:
    """The server closes that backend's connection, and the backend is gone."""
    with other_connection() as other:
        assert other.execute("SELECT pg_terminate_backend(%s)", [pid]).fetchone()[0]
        deadline = time.monotonic() + 10
        while other.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone():
            assert time.monotonic() < deadline, "the backend did not exit"
            time.sleep(0.02)


def test_a_healthy_idle_connection_is_checked_without_a_statement():
    pid, marker = marked_backend()
    connection.close_if_unusable_or_obsolete()  # as before a request or task: check again
    with connection.cursor() as cursor:  # the check runs before the cursor is made
        assert not connection.errors_occurred
    assert marker in last_statement(pid)
    # Django's own check, for contrast, is the statement this test would see
    db = connections["default"]
    assert super(type(db), db).is_usable()
    assert last_statement(pid).strip() == "SELECT 1"
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        assert cursor.fetchone()[0] == pid  # the same connection, kept


def test_a_connection_the_server_closed_is_replaced_before_it_is_used():
    pid, _ = marked_backend()
    backend_terminate(pid)
    assert not connection.is_usable()
    connection.close_if_unusable_or_obsolete()
    with connection.cursor() as cursor:  # no error: the check replaced it first
        cursor.execute("SELECT pg_backend_pid()")
        assert cursor.fetchone()[0] != pid


def test_the_api_key_read_first_in_a_request_replaces_a_connection_the_server_closed():
    """The key is read by a prepared statement straight to psycopg, not through Django's cursor:
    it runs the same check before it."""
    pid, _ = marked_backend()
    backend_terminate(pid)
    connection.close_if_unusable_or_obsolete()  # as before a request
    key = api_key_authenticate(presented=os.environ["TEST_ACME_KEY"])
    assert key.tenant == Tenant.objects.get(schema_name="acme")
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        assert cursor.fetchone()[0] != pid
