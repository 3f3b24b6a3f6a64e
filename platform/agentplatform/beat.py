"""Exactly one beat ticks: its scheduler holds a PostgreSQL session advisory lock.

Any number of `celery beat` processes may run (one per host for availability, or a new one
started before the old one stopped); only the one holding the lock sends the periodic tasks,
the others ask for it every LOCK_RETRY_SECONDS and send nothing. The lock lives on a connection
of its own and goes with it: when its process dies, its connection breaks, or its host vanishes
(the server's TCP keepalives, asked for below, notice within about 30 s). A beat whose
connection breaks stops ticking until it holds the lock again.
"""

import logging
import time

import psycopg
from celery.beat import PersistentScheduler
from django.conf import settings

from agentplatform.tenant_database.base import needs_round_trip

log = logging.getLogger(__name__)
BEAT_LOCK = 0x6170_6265_6174  # any constant: one beat ticks
LOCK_RETRY_SECONDS = 1.0
KEEPALIVES = {"keepalives_idle": 10, "keepalives_interval": 5, "keepalives_count": 3}


def lock_connect() -> psycopg.Connection:
    """A connection for the lock alone: straight to PostgreSQL or through a session pool
    (BEAT_LOCK_DATABASE_URL), never a transaction pool, where a session lock means nothing."""
    db = settings.BEAT_LOCK_DATABASE
    server_keepalives = " ".join(f"-c tcp_{name}={value}" for name, value in KEEPALIVES.items())
    return psycopg.connect(
        host=db["HOST"] or None, port=db["PORT"] or None, dbname=db["NAME"],
        user=db["USER"] or None, password=db["PASSWORD"] or None, autocommit=True,
        connect_timeout=5, application_name="agentplatform-beat", keepalives=1, **KEEPALIVES,
        options=server_keepalives)


class OneBeatScheduler(PersistentScheduler):
    """Celery's default scheduler (its schedule kept in the `-s` file), ticking only while
    this process holds the one-beat lock."""

    lock_connection: psycopg.Connection | None = None
    checked_at = 0.0  # time.monotonic() of the last statement on the lock's session
    holding = False
    said_waiting = False

    def tick(self, *args, **kwargs) -> float:
        if not self.lock_held():
            return LOCK_RETRY_SECONDS
        return super().tick(*args, **kwargs)

    def lock_held(self) -> bool:
        was_holding = self.holding
        try:
            if self.lock_connection is None:
                self.lock_connection = lock_connect()
            if self.holding:
                if self._check_due():  # the session, and so the lock, lives
                    self.lock_connection.execute("SELECT 1")
                    self.checked_at = time.monotonic()
            else:
                self.holding = self.lock_connection.execute(
                    "SELECT pg_try_advisory_lock(%s)", [BEAT_LOCK]).fetchone()[0]
                self.checked_at = time.monotonic()
        except psycopg.Error as exc:
            self.lock_close()
            if was_holding:
                log.warning("beat: lost the one-beat lock (%s); not ticking until it is held "
                            "again", exc)
            return False
        if self.holding and not was_holding:
            log.info("beat: holding the one-beat lock; ticking")
        elif not self.holding and not self.said_waiting:
            self.said_waiting = True
            log.info("beat: another beat holds the one-beat lock; waiting for it")
        return self.holding

    def _check_due(self) -> bool:
        """Celery calls `tick` many times a second near due times: the lock's session is asked
        with a statement (a transaction) only when its socket shows the server may have closed
        it, or LOCK_RETRY_SECONDS after the last time."""
        return (needs_round_trip(self.lock_connection)
                or time.monotonic() - self.checked_at >= LOCK_RETRY_SECONDS)

    def lock_close(self) -> None:
        self.holding = False
        if self.lock_connection is not None:
            self.lock_connection.close()
            self.lock_connection = None

    def close(self) -> None:
        super().close()
        self.lock_close()
