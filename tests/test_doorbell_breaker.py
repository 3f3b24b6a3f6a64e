"""The doorbell's breaker on its own (tests/runs/test_hung_broker.py drives it through a real,
hung Redis): what opens it, what closes it, and that one caller at a time probes once its
window has passed, whatever way that probe ends."""

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis
from kombu.exceptions import EncodeError, OperationalError

from agentplatform.doorbell import _Breaker
from tests.support.waiting import wait_for


def _wrapped(cause: BaseException) -> OperationalError:
    """As Celery raises a transport's error: kombu's OperationalError, the error its cause."""
    try:
        raise OperationalError(str(cause)) from cause
    except OperationalError as exc:
        return exc


@pytest.fixture
def breaker(settings):
    settings.BROKER_AWAY_SECONDS = 0.3
    return _Breaker()


def _opened(breaker: _Breaker) -> _Breaker:
    assert breaker.failed(_wrapped(redis.TimeoutError("Timeout reading from socket")))
    return breaker


def _window_passed(breaker: _Breaker) -> None:
    wait_for(lambda: not breaker.away(), timeout=5, interval=0.05, what="the window to pass")


def _elsewhere(call):
    with ThreadPoolExecutor(1) as thread:
        return thread.submit(call).result()


@pytest.mark.parametrize("error", [
    _wrapped(redis.TimeoutError("Timeout reading from socket")),
    _wrapped(redis.ConnectionError("Error 111 connecting")),
    ConnectionRefusedError(111, "Connection refused"),
])
def test_a_broker_out_of_reach_opens_it(breaker, error):
    assert not breaker.skip()
    assert breaker.failed(error)
    assert breaker.away() and breaker.skip()


@pytest.mark.parametrize("error", [
    _wrapped(redis.ResponseError("OOM command not allowed")),  # it answered
    _wrapped(KeyError("a bug's")),
    EncodeError("not JSON"),
])
def test_an_error_that_is_not_the_broker_out_of_reach_leaves_it_closed(breaker, error):
    assert not breaker.failed(error)
    assert not breaker.away() and not breaker.skip()


def test_after_the_window_one_caller_probes_while_the_others_skip(breaker):
    _opened(breaker)
    _window_passed(breaker)
    assert not breaker.skip()  # this thread probes
    assert breaker.away()
    assert _elsewhere(breaker.skip)  # another skips while it does
    assert not _elsewhere(breaker.probe_over)  # only the prober ends its probe
    assert _elsewhere(breaker.skip)
    assert _opened(breaker).skip()  # it failed: another window


def test_a_probe_that_gets_through_closes_it(breaker):
    _opened(breaker)
    _window_passed(breaker)
    assert not breaker.skip()
    breaker.answered()
    assert not breaker.away() and not _elsewhere(breaker.skip)


def test_an_answer_with_an_error_closes_it_too(breaker):
    _opened(breaker)
    assert not breaker.failed(_wrapped(redis.ResponseError("READONLY")))
    assert not breaker.away() and not breaker.skip()


def test_a_probe_that_ends_without_a_word_on_the_broker_hands_it_to_the_next_caller(breaker):
    _opened(breaker)
    _window_passed(breaker)
    assert not breaker.skip()
    # a ring of its batch could not be encoded: the batch goes on, and the probe with it
    assert not breaker.failed(EncodeError("not JSON"))
    assert _elsewhere(breaker.skip)
    breaker.probe_over()  # the caller's finally
    assert not breaker.away()
    assert not _elsewhere(breaker.skip)  # the next caller probes
    assert breaker.skip()  # and this one now skips


def test_another_callers_failure_during_a_probe_leaves_the_probe_alone(breaker):
    """A send that started before the breaker opened, or the tick's (which always tries),
    fails while a probe is out: the window moves on, and still no second probe starts."""
    _opened(breaker)
    _window_passed(breaker)
    assert not breaker.skip()  # this thread probes
    _elsewhere(lambda: _opened(breaker))
    _window_passed_but_the_probe(breaker)
    assert _elsewhere(breaker.skip)  # the probe is still out
    breaker.probe_over()
    assert not _elsewhere(breaker.skip)


def _window_passed_but_the_probe(breaker: _Breaker) -> None:
    wait_for(lambda: time.monotonic() >= breaker._until, timeout=5, interval=0.05,
             what="the window to pass")
