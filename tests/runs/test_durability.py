"""Durability: checkpoints before anything leaves the process; storage grows linearly."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.db import connection

from runs import engine
from runs.models import Run
from runs.services import run_start
from tests.support.runs import other_connection
from tests.support.waiting import wait_for


class CheckpointWitness:
    """An HTTP receiver that, on every request, looks (on its own connection) at which
    checkpoints of the sending run are already committed."""

    def __init__(self, schema: str):
        # PostgreSQL itself, never preparing: through a transaction pool (POOLER=pgbouncer) a
        # statement psycopg prepared on one server connection is missing on the next
        self.db = other_connection()
        self.schema = schema
        self.seen: list[tuple[int, int]] = []  # (visit the step ran at, newest committed visit)
        witness = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                newest = witness.db.execute(
                    f'SELECT max(visit) FROM "{witness.schema}".runs_checkpoint WHERE run_id = %s',
                    [body["run"]],
                ).fetchone()[0]
                witness.seen.append((body["visit"], newest))
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.db.close()


@pytest.mark.parametrize("durability", ["async", "sync"])
def test_no_external_action_runs_ahead_of_its_checkpoint(in_acme, durability):
    witness = CheckpointWitness("acme")
    try:
        run = run_start(agent="notifier", input={"url": witness.url, "count": 40},
                        durability=durability, enqueue=False).run
        # one slice for all 40 steps, however busy the machine: this is about barriers
        assert engine.advance(run_id=run.id, slice_seconds=3600) == engine.Outcome.ENDED
    finally:
        witness.close()
    assert Run.objects.get(id=run.id).status == "succeeded"
    assert len(witness.seen) == 40
    # A step at visit v depends on checkpoint v: it must be committed before the action.
    assert all(newest is not None and newest >= visit for visit, newest in witness.seen), \
        witness.seen


def stored_bytes(run_id) -> int:
    with connection.cursor() as cursor:
        total = 0
        for table in ("runs_run", "runs_checkpoint", "runs_logentry", "runs_runevent"):
            column = "id" if table == "runs_run" else "run_id"
            cursor.execute(f"SELECT coalesce(sum(pg_column_size(t.*)), 0) FROM {table} t "
                           f"WHERE {column} = %s", [run_id])
            total += cursor.fetchone()[0]
    return total


def test_bytes_stored_per_step_do_not_grow_with_run_length(in_acme):
    per_step = {}
    for steps in (100, 1000):
        run = run_start(agent="chatter", input={"steps": steps}, enqueue=False,
                        max_steps=5000).run
        assert engine.advance(run_id=run.id, slice_seconds=600) == engine.Outcome.ENDED
        per_step[steps] = stored_bytes(run.id) / steps
    assert per_step[1000] == pytest.approx(per_step[100], rel=0.2), per_step
    assert per_step[1000] < 1024  # ~200 B message + a small checkpoint, not the whole history


def test_long_run_is_sliced_and_resumed_by_real_workers_with_continuous_counters(
        acme_api, worker):
    run_id = acme_api.post("/api/v1/runs", {"agent": "slowpoke",
                                            "input": {"seconds": 0.15, "count": 12}},
                           format="json").json()["id"]
    owners = set()

    def done():
        run = Run.objects.get(id=run_id)
        if run.lease_owner:
            owners.add(run.lease_epoch)
        return run.status == "succeeded" and run

    with connection.cursor():
        connection.set_schema("acme")
        run = wait_for(done, timeout=60, what="the sliced run to finish")
    assert run.result == 12 and run.steps_taken == 12
    assert run.lease_epoch >= 3  # 12 × 0.15 s in 0.5 s slices: claimed several times
