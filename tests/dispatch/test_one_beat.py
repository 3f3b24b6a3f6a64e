"""Exactly one beat ticks: of two real `celery beat` processes the second sends nothing while
the first lives, and takes over once the first is killed (agentplatform/beat.py)."""

import signal
import time

from agentplatform import localprocs
from agentplatform.beat import LOCK_RETRY_SECONDS
from tests.conftest import LOGS
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
