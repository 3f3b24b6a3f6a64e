"""The hot path's statements (agentplatform/prepared.py) go through one psycopg cursor kept on
the thread's Django connection: a failed statement, a closed connection and a transaction
rolled back leave it working, and the statement's errors are Django's."""

import threading

import pytest
from django.db import DataError, connection, transaction

from agentplatform.prepared import prepared_row


def test_a_failed_statement_raises_djangos_error_and_the_next_one_runs():
    with pytest.raises(DataError), transaction.atomic():
        prepared_row("SELECT 1 / %s::int", [0])
    assert prepared_row("SELECT %s::int + 1", [41]) == (42,)
    assert prepared_row("SELECT 1 WHERE false", []) is None  # no row
    assert prepared_row("SET LOCAL lock_timeout = '1s'", []) is None  # no rows at all


def test_after_the_connection_is_closed_a_new_one_serves_the_next_statement():
    before = prepared_row("SELECT pg_backend_pid()", [])[0]
    connection.close()
    after = prepared_row("SELECT pg_backend_pid()", [])[0]
    assert after != before
    assert prepared_row("SELECT %s::text", ["still here"]) == ("still here",)


def test_a_rolled_back_transaction_leaves_the_cursor_working():
    with pytest.raises(RuntimeError), transaction.atomic():
        assert prepared_row("SELECT %s::int", [1]) == (1,)
        raise RuntimeError("rolled back")
    assert prepared_row("SELECT %s::int", [2]) == (2,)


def test_each_thread_runs_its_statements_on_its_own_connection():
    mine = prepared_row("SELECT pg_backend_pid()", [])[0]
    theirs: list[int] = []

    def other() -> None:
        try:
            theirs.append(prepared_row("SELECT pg_backend_pid()", [])[0])
        finally:
            connection.close()

    thread = threading.Thread(target=other)
    thread.start()
    thread.join(timeout=30)
    assert theirs and theirs[0] != mine
    assert prepared_row("SELECT pg_backend_pid()", [])[0] == mine
