"""Exactly one beat ticks: of two real `celery beat` processes the second sends nothing while
the first lives, and takes over once the first is killed (agentplatform/beat.py)."""

import signal
import time

from agentplatform import beat, localprocs
from agentplatform.beat import LOCK_RETRY_SECONDS
from tests.conftest import LOGS
from tests.support.runs import other_connection
from tests.support.waiting import wait_for

SENT = "Sending due task"  # beat's log line for each periodic task it sends


def test_a_second_beat_sends_nothing_until_the_first_is_killed(_session_beat, tmp_path):
    _session_beat.stop()  # it would hold the lock itself; the `beat` fixture starts it again
    beats = []
    (tmp_path / "first").mkdir()
    (tmp_path / "second").mkdir()
    try:
        first = localprocs.Beat(tmp_path / "first", log_dir=LOGS, name="beat-first")
        beats.append(first)
        wait_for(lambda: first.log_count(SENT) >= 2, timeout=30, what="the first beat to tick")
        assert "holding the one-beat lock" in first.log_tail(20000)

        second = localprocs.Beat(tmp_path / "second", log_dir=LOGS, name="beat-second")
        beats.append(second)
        wait_for(lambda: "another beat holds the one-beat lock" in second.log_tail(20000),
                 timeout=30, what="the second beat to find the lock taken")
        sent_by_first = first.log_count(SENT)
        time.sleep(3 * LOCK_RETRY_SECONDS)  # the second asks for the lock three times meanwhile
        assert first.log_count(SENT) >= sent_by_first + 6  # the dispatch tick alone: every 0.5 s
        assert second.process.poll() is None and second.log_count(SENT) == 0

        first.kill(signal.SIGKILL)  # its session ends with it, and the lock with the session
        wait_for(lambda: second.log_count(SENT) >= 2, timeout=15,
                 what="the second beat to take over")
        assert "holding the one-beat lock" in second.log_tail(20000)
    finally:
        for beat in beats:
            beat.stop()


def test_the_lock_is_asked_with_a_statement_only_when_its_session_may_be_gone(monkeypatch):
    """Celery ticks many times a second near due times: the lock's session is not asked with a
    statement on each tick, yet a session the server ended is noticed at the next tick."""
    monkeypatch.setattr(beat, "BEAT_LOCK", beat.BEAT_LOCK + 1)  # not the session beat's lock
    scheduler = object.__new__(beat.OneBeatScheduler)  # lock_held alone, without Celery's setup
    try:
        assert scheduler.lock_held()
        pid = scheduler.lock_connection.info.backend_pid
        with other_connection() as other:
            def last_statement():
                return other.execute("SELECT query, query_start FROM pg_stat_activity "
                                     "WHERE pid = %s", [pid]).fetchone()

            query, started = last_statement()
            assert [scheduler.lock_held() for _ in range(20)] == [True] * 20
            assert last_statement() == (query, started)  # no statement since
            scheduler.checked_at -= LOCK_RETRY_SECONDS  # a while later: asked once
            assert scheduler.lock_held() and last_statement()[0] == "SELECT 1"
            other.execute("SELECT pg_terminate_backend(%s)", [pid])
            wait_for(lambda: not other.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s",
                                               [pid]).fetchone(), what="the session to end")
        assert not scheduler.lock_held()  # at once, not LOCK_RETRY_SECONDS later
        assert scheduler.lock_held()  # and taken again on a new session
    finally:
        scheduler.lock_close()
