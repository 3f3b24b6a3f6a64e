"""The dispatcher's lock (one dispatcher at a time, platform-wide) is never held while a caller
goes on working: a wake-up dispatches once it commits, waiting a bounded time for the lock in a
transaction of its own; only a start and a worker's run leaving it, which commit right after,
dispatch inside their own transaction (decision 0025). Real PostgreSQL; a second connection
plays the other dispatcher. No beat runs, so nothing but the code under test hands a run out."""

import threading
import time
import uuid

import pytest
from django.db import connection, transaction

from runs.approvals.services import event_submit
from runs.dispatch.models import ReadyRun
from runs.dispatch.services import DISPATCH_LOCK, dispatch_ready
from runs.models import Run
from runs.services import RunError, run_cancel, run_start
from tests.support.runs import finished, other_connection, start

pytestmark = pytest.mark.usefixtures("no_beat", "room")


def dispatched(run_id) -> bool:
    return ReadyRun.objects.filter(run_id=run_id, dispatched_at__isnull=False).exists()


def settle(*run_ids):
    """Leave nothing in line or counted as handed out (the caps of the tests that follow):
    cancelled, unless a session worker took and ended it first, and out of the ready list
    (which, with no beat, no watchdog would clear)."""
    for run_id in run_ids:
        try:
            run_cancel(run_id=run_id, by="test")
        except RunError:
            assert Run.objects.get(id=run_id).is_finished
        ReadyRun.objects.filter(run_id=run_id).delete()


def test_an_event_that_wakes_many_runs_leaves_the_lock_free_and_dispatches_them_on_commit(in_acme):
    key = f"k-{uuid.uuid4().hex[:8]}"
    parked = [finished(start("waiter", input={"how": "event", "kind": "doc.signed",
                                              "key": key}).id).id for _ in range(4)]
    other = other_connection()
    try:
        with transaction.atomic():
            assert len(event_submit(kind="doc.signed", key=key, payload={}).resumed) == 4
            # the waking transaction has not committed: any other dispatcher may still work
            assert other.execute("SELECT pg_try_advisory_lock(%s)", [DISPATCH_LOCK]).fetchone()[0]
            other.execute("SELECT pg_advisory_unlock(%s)", [DISPATCH_LOCK])
            assert not any(dispatched(run_id) for run_id in parked)
        # committed: dispatched at once, without a tick
        assert all(dispatched(run_id) for run_id in parked)
    finally:
        other.close()
        settle(*parked)


def test_a_start_that_meets_another_dispatcher_is_handed_out_when_that_one_lets_go(in_acme,
                                                                                   settings):
    settings.DISPATCH_LOCK_WAIT_SECONDS = 30  # far more than the other one holds it
    other = other_connection()
    other.execute("SELECT pg_advisory_lock(%s)", [DISPATCH_LOCK])
    release = threading.Timer(0.3, lambda: other.execute("SELECT pg_advisory_unlock(%s)",
                                                         [DISPATCH_LOCK]))
    release.start()
    try:
        run = run_start(agent="slowpoke", input={"seconds": 0.1, "count": 1}).run
        release.join()
        assert dispatched(run.id)  # it waited for the lock after its commit, not for a tick
    finally:
        other.close()
        settle(run.id)


def test_a_start_gives_up_waiting_for_a_held_lock_and_stays_in_line(in_acme, settings):
    settings.DISPATCH_LOCK_WAIT_SECONDS = 0.2
    other = other_connection()
    other.execute("SELECT pg_advisory_lock(%s)", [DISPATCH_LOCK])
    try:
        run = run_start(agent="slowpoke", input={"seconds": 0.1, "count": 1}).run  # no error
        assert ReadyRun.objects.filter(run_id=run.id, dispatched_at__isnull=True).exists()
    finally:
        other.close()  # the lock goes with its session
        settle(run.id)


def test_a_dispatch_registered_in_a_rolled_back_savepoint_does_not_stand_for_the_outer_one(
        in_acme):
    with transaction.atomic():
        with pytest.raises(RuntimeError), transaction.atomic():
            run_start(agent="slowpoke", input={"seconds": 0.1, "count": 1})
            raise RuntimeError("this part is rolled back")
        kept = run_start(agent="slowpoke", input={"seconds": 0.1, "count": 1}).run
    try:
        assert dispatched(kept.id)
    finally:
        settle(kept.id)


def test_a_dispatch_that_waited_leaves_the_callers_lock_timeout_as_it_was(in_acme):
    """A start (or a run's end) goes on to commit after its dispatch waited for the lock with a
    bounded lock_timeout: its own lock waits, the commit's included, are not bounded by it."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL lock_timeout = '7s'")
        assert dispatch_ready(wait=True, robust=True) is not None
        cursor.execute("SELECT current_setting('lock_timeout')")
        assert cursor.fetchone()[0] == "7s"


def test_a_dispatch_that_gave_up_waiting_leaves_the_callers_lock_timeout_as_it_was(in_acme,
                                                                                  settings):
    """The wait is bounded by DISPATCH_LOCK_WAIT_SECONDS, not by the caller's lock_timeout, and
    giving up rolls back only the dispatch: the caller's transaction and setting go on."""
    settings.DISPATCH_LOCK_WAIT_SECONDS = 0.2
    other = other_connection()
    other.execute("SELECT pg_advisory_lock(%s)", [DISPATCH_LOCK])
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SET LOCAL lock_timeout = '45s'")
            began = time.monotonic()
            assert dispatch_ready(wait=True, robust=True) is None
            assert time.monotonic() - began < 30  # its own bound, far below the caller's
            cursor.execute("SELECT current_setting('lock_timeout')")
            assert cursor.fetchone()[0] == "45s"
    finally:
        other.close()
