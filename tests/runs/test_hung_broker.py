"""A broker that hangs holds nothing up. A Redis stopped with SIGSTOP still accepts connections
(the kernel does) and never answers: before BROKER_SOCKET_TIMEOUT, a POST whose run's task went
to it waited forever on the send, and so did a worker asking it what waits. Now the send fails
in seconds, the POST answers, the process tries the broker for none of its next
POSTs for BROKER_AWAY_SECONDS and then for one at a time, and the dispatcher's tick (its
process's broker answers) sends the runs."""

import os
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis
import requests
from django.conf import settings

from tests.support.api import status_of
from tests.support.fakes.smtp import free_port
from tests.support.live_server import LiveServer
from tests.support.waiting import wait_for

TIMEOUT, AWAY = 1, 3  # BROKER_SOCKET_TIMEOUT, BROKER_AWAY_SECONDS of the API's process


@pytest.fixture
def hung_redis():
    """A Redis server of the test's own, stopped: its URL."""
    port = free_port()
    server = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                               "--save", "", "--appendonly", "no"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        wait_for(lambda: _answers(url), what="the test's Redis to answer")
        os.kill(server.pid, signal.SIGSTOP)
        assert not _answers(url)  # accepts, never answers
        yield url
    finally:
        os.kill(server.pid, signal.SIGCONT)
        server.terminate()
        server.wait(timeout=30)


def _answers(url: str) -> bool:
    try:
        return redis.Redis.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5).ping()
    except redis.RedisError:
        return False


def test_posts_answer_while_their_broker_hangs_and_their_runs_are_sent_later(
        acme_api, worker, hung_redis):
    server = LiveServer(name="api-hung-broker", env={
        "TEST_REDIS_URL": hung_redis, "CACHE_URL": settings.CELERY_BROKER_URL,
        "BROKER_SOCKET_TIMEOUT": str(TIMEOUT), "BROKER_AWAY_SECONDS": str(AWAY),
    }).start()
    try:
        # Without the socket timeout the first request never got an answer: 60 s is a bound
        # on a hang, not a measure of speed (the send gives up in seconds).
        first = _post(server.url)
        away_ends = time.monotonic() + AWAY  # at the latest: the send failed before it answered
        assert first.elapsed.total_seconds() >= TIMEOUT  # it did wait on the broker
        # The next two try nothing (the broker was away moments ago): not even a pick. (A try
        # waits 4 s: its timeouts and kombu's connect retries; 2 s leaves room for a busy
        # machine, here and below.)
        later = [_post(server.url) for _ in range(2)]
        assert all(answer.elapsed.total_seconds() < 2 * TIMEOUT for answer in later), later
        log = server.log_tail(200000)
        assert log.count("doorbell not rung") == 1, log
        assert "Timeout" in log
        # Once the window has passed, one request probes the broker (and waits on it); the
        # others answer at once, rather than all of them waiting on it side by side.
        time.sleep(max(0.0, away_ends - time.monotonic()))
        with ThreadPoolExecutor(4) as pool:
            together = list(pool.map(_post, [server.url] * 4))
        slow = [answer for answer in together if answer.elapsed.total_seconds() >= 2 * TIMEOUT]
        assert len(slow) == 1, [answer.elapsed for answer in together]
        assert server.log_tail(200000).count("doorbell not rung") == 2
        for answer in [first, *later, *together]:
            run = status_of(acme_api, answer.json()["id"], "succeeded")
            assert run["result"] == {"said": 2, "messages": 2}
    finally:
        server.stop()


def _post(server_url: str) -> requests.Response:
    answer = requests.post(f"{server_url}/api/v1/runs", timeout=60, json={
        "agent": "chatter", "input": {"steps": 2}},
        headers={"Authorization": f"Bearer {os.environ['TEST_ACME_KEY']}"})
    assert answer.status_code == 201, answer.text
    return answer
