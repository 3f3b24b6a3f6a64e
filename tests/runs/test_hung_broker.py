"""A broker that hangs holds nothing up. A Redis stopped with SIGSTOP still accepts connections
(the kernel does) and never answers: before BROKER_SOCKET_TIMEOUT, a POST whose run's task went
to it waited forever on the send, and so did a worker asking it what waits. Now the send fails
in about two timeouts, the POST answers, the process's next sends are not tried for
BROKER_AWAY_SECONDS, and the dispatcher's tick (its process's broker answers) sends the runs."""

import os
import signal
import subprocess

import pytest
import redis
import requests
from django.conf import settings

from tests.support.api import status_of
from tests.support.fakes.smtp import free_port
from tests.support.live_server import LiveServer
from tests.support.waiting import wait_for


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
        "BROKER_SOCKET_TIMEOUT": "1", "BROKER_AWAY_SECONDS": "600",
    }).start()
    try:
        run_ids = []
        for _ in range(3):
            # Without the socket timeout the first request never got an answer: 60 s is a
            # bound on a hang, not a measure of speed (the send gives up after about 2 s).
            answer = requests.post(f"{server.url}/api/v1/runs", timeout=60, json={
                "agent": "chatter", "input": {"steps": 2}},
                headers={"Authorization": f"Bearer {os.environ['TEST_ACME_KEY']}"})
            assert answer.status_code == 201, answer.text
            run_ids.append(answer.json()["id"])
        log = server.log_tail(200000)
        # The first send was tried and timed out; the next two were not tried at all (the
        # broker was away moments ago), so no request waited on it but the first.
        assert log.count("doorbell not rung") == 1, log
        assert "Timeout" in log
        assert log.count("ring(s) not tried, the broker was away moments ago") == 2, log
        for run_id in run_ids:
            run = status_of(acme_api, run_id, "succeeded")
            assert run["result"] == {"said": 2, "messages": 2}
    finally:
        server.stop()
