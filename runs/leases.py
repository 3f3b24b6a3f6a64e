"""Heartbeats: one thread per worker process extends the leases that process holds.

A lease is (owner, epoch, expires_at) on a run or a fan-out branch. Checkpoint writes extend
it too; the heartbeat covers long steps. If the process freezes or dies, the heartbeat stops
with it, the lease expires and the watchdog hands the work to another worker.

Each beat also upserts the process's row in the public heartbeat table (WorkerHeartbeat): one
small statement per process per beat, so the console sees which workers are alive.
"""

import logging
import os
import socket
import threading
from datetime import timedelta
from uuid import UUID

from django.conf import settings
from django.db import connection, transaction

from agentplatform.metrics import fenced_writes_refused
from runs.dispatch.models import WorkerHeartbeat

log = logging.getLogger(__name__)
HEARTBEATS = f"public.{WorkerHeartbeat._meta.db_table}"
# Rows of processes gone for this long are deleted (by any live worker, now and then).
HEARTBEAT_FORGET = timedelta(days=1)
HEARTBEAT_PRUNE_EVERY = 360  # beats
HEARTBEAT_ROW_TIMEOUT_MS = "1000"  # at most this long on the row per beat, then given up


def fenced_write_refused(*, write: str, detail: str) -> str:
    """Count and log a write refused by fencing (its lease or claim moved on: this worker was
    cut off or frozen and came back); returns `detail`, e.g. for the LeaseLost it raises. One
    log line a write, "fenced write refused (<write>): ...", for operators and benchmarks."""
    fenced_writes_refused.add(1, {"write": write})
    log.warning("fenced write refused (%s): %s", write, detail)
    return detail


def worker_id() -> str:
    """This process as a lease owner and in the heartbeat table: `host:pid`."""
    return f"{socket.gethostname()}:{os.getpid()}"


class LeaseKeeper:
    def __init__(self):
        self._held: dict[tuple[str, str, UUID | int], int] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()
        self._beats = 0

    def hold(self, *, schema: str, table: str, row_id, epoch: int) -> None:
        with self._lock:
            self._held[(schema, table, row_id)] = epoch
            self._thread_ensure()

    def start(self) -> None:
        """Beat from now on, holding nothing yet: a worker process is listed alive from its
        start, not only from its first claim."""
        with self._lock:
            self._thread_ensure()

    def _thread_ensure(self) -> None:
        if self._thread is None or not self._thread.is_alive():  # new process after fork
            self._thread = threading.Thread(target=self._beat, name="lease-heartbeat",
                                            daemon=True)
            self._thread.start()

    def release(self, *, schema: str, table: str, row_id) -> None:
        with self._lock:
            self._held.pop((schema, table, row_id), None)

    def held(self) -> dict:
        with self._lock:
            return dict(self._held)

    def _beat(self) -> None:
        while True:
            self._wake.wait(settings.RUN_HEARTBEAT_SECONDS)
            try:
                self.extend_all()
            except Exception:  # the database may be restarting: try again next beat
                log.warning("lease heartbeat failed; retrying", exc_info=True)
                connection.close()
                continue
            try:
                self.worker_beat()
            except Exception:  # only the console reads it: the leases above are what matter
                log.debug("worker heartbeat row not written", exc_info=True)
                connection.close()  # so a connection it broke does not fail the next extension

    def extend_all(self) -> None:
        ttl = timedelta(seconds=settings.RUN_LEASE_SECONDS)
        for (schema, table, row_id), epoch in self.held().items():
            with connection.cursor() as cursor:
                cursor.execute(
                    f'UPDATE "{schema}".{table} SET lease_expires_at = now() + %s '
                    # a released lease (NULL) is not re-armed by a beat that comes too late
                    "WHERE id = %s AND lease_epoch = %s AND lease_expires_at IS NOT NULL",
                    [ttl, row_id, epoch],
                )
                if cursor.rowcount == 0:  # taken over: the holder stops at its next write
                    fenced_write_refused(write="heartbeat", detail=(
                        f"lease on {schema}.{table} {row_id} (epoch {epoch}) was taken over"))
                    self.release(schema=schema, table=table, row_id=row_id)

    def worker_beat(self) -> None:
        """Say this process is alive, and how many leases it holds (public schema). It runs on
        the lease thread, so it is held to HEARTBEAT_ROW_TIMEOUT_MS: a locked or slow heartbeat
        table must not hold up the next lease extension."""
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT set_config('statement_timeout', %s, true), "
                           "set_config('lock_timeout', %s, true)",
                           [HEARTBEAT_ROW_TIMEOUT_MS, HEARTBEAT_ROW_TIMEOUT_MS])
            cursor.execute(
                f"INSERT INTO {HEARTBEATS} (worker, started_at, beat_at, leases_held) "
                "VALUES (%s, now(), now(), %s) ON CONFLICT (worker) DO UPDATE "
                "SET beat_at = now(), leases_held = EXCLUDED.leases_held",
                [worker_id(), len(self.held())],
            )
            self._beats += 1
            if self._beats % HEARTBEAT_PRUNE_EVERY == 0:
                cursor.execute(f"DELETE FROM {HEARTBEATS} WHERE beat_at < now() - %s",
                               [HEARTBEAT_FORGET])


leases = LeaseKeeper()
