"""The doorbell: every Celery enqueue goes through here, so services never import task modules.

A task is sent by name once the caller's transaction commits (at once outside a transaction,
or from a commit hook). The message carries the tenant schema header tenant-schemas-celery
reads (`_schema_name`: the given schema, else the connection's when rung) and is routed by
agentplatform.celery.task_route like any other send.

It also carries the trace: the W3C traceparent of the span that rang (or the one given), taken
when rung, as the commit may come later and elsewhere. It goes into the headers, and is the
current context while sending, so that in a worker Celery's own publish span is its child.
"""

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import redis
from django.conf import settings
from django.db import connection, transaction
from kombu.exceptions import ChannelError, OperationalError

from agentplatform.celery import app, task_route
from agentplatform.telemetry import trace_attached, trace_parent

log = logging.getLogger(__name__)
# A broker that cannot be reached: a connection that failed or timed out. Celery re-raises
# every error of the transport as kombu's OperationalError, the one it came from as its cause;
# an error the broker answered with (out of memory, read-only, an ACL) or a bug's is one
# send's failure, not the broker away.
_UNREACHABLE = (redis.ConnectionError, redis.TimeoutError, OSError)


class _Breaker:
    """Whether this process takes the broker to be away. After a send or an ask failed for want
    of it, robust rings are unrung and asks answered None without trying, for
    BROKER_AWAY_SECONDS; then one caller at a time probes it (the others still skip) until one
    gets through or the broker answers with an error, which closes the breaker, or one fails to
    reach it, which opens another window; a probe that ends without a word on the broker (its
    message could not be encoded, it was interrupted) hands the probe to the next caller. So a
    broker that hangs costs one request per window its timeouts, not every thread's request in
    turn, and one that is back is used again at once."""

    def __init__(self):
        self._lock = threading.Lock()
        self._open = False  # read without the lock on the way in: a stale False costs a try
        self._until = 0.0  # time.monotonic() until which callers skip
        self._prober: int | None = None  # the thread probing, while one does
        self._probe_until = 0.0  # and until when at most, if it never says (its thread died)

    def away(self) -> bool:
        """Whether the broker is away (moments ago, or being probed), without taking a probe."""
        if not self._open:
            return False
        now = time.monotonic()
        return now < self._until or (self._prober is not None and now < self._probe_until)

    def skip(self) -> bool:
        """Whether to skip the broker now: True while it is away; False to go ahead, and if the
        window has passed, this caller is the probe (the others skip until it is done: the
        caller ends it in a `finally` with `probe_over`, if nothing said more)."""
        if not self._open:
            return False
        with self._lock:
            if self.away():
                return True
            if self._open:  # (not closed meanwhile)
                self._prober = threading.get_ident()
                self._probe_until = time.monotonic() + _probe_longest()
            return False

    def failed(self, exc: BaseException) -> bool:
        """What `exc` says of the broker: unreachable (a connection refused, reset or timed
        out, a login refused, Redis still loading), which opens another window and is the only
        case that returns True; answering (an error Redis sent: out of memory, read-only, an
        ACL), which closes the breaker; or nothing (an error of ours before it was reached)."""
        cause = exc.__cause__ if isinstance(exc, OperationalError) else exc
        if isinstance(cause, _UNREACHABLE):
            with self._lock:
                self._open = True
                self._until = time.monotonic() + settings.BROKER_AWAY_SECONDS
                if self._prober == threading.get_ident():
                    self._prober = None
            return True
        if isinstance(cause, redis.RedisError):
            self.answered()
        return False

    def answered(self) -> None:
        if self._open:
            with self._lock:
                self._open, self._prober = False, None

    def probe_over(self) -> None:
        """This thread's probe, if it holds one, is over: the next caller probes."""
        if self._prober == threading.get_ident():
            with self._lock:
                if self._prober == threading.get_ident():
                    self._prober = None


def _probe_longest() -> float:
    """How long the others skip while one caller probes, if it never says (its thread died
    mid-send): longer than a send can take (kombu's connect retries, 2 s and 4 s apart, and two
    or three socket timeouts: 4-7.5 s measured), with room to spare."""
    return 10 + 4 * settings.BROKER_SOCKET_TIMEOUT


_breaker = _Breaker()


def doorbell_away() -> bool:
    """Whether robust rings are skipped now (the broker failed this process moments ago): a
    caller about to pick work only to ring it may leave the pick to the tick."""
    return _breaker.away()


@dataclass(frozen=True)
class Ring:
    """One task to send: `task_name(*args)` in `schema`'s tenant, continuing `traceparent`'s
    trace; `unrung()`, if given, is called if it could not be sent (robust rings)."""
    task_name: str
    args: Sequence
    schema: str
    traceparent: str
    unrung: Callable[[], None] | None = None


def doorbell_ring(task_name: str, args: Sequence = (), *, schema: str | None = None,
                  robust: bool = False, traceparent: str | None = None,
                  unrung: Callable[[], None] | None = None) -> None:
    """Send `task_name(*args)` on commit. `robust`: a broker that is away is logged, not
    raised (for work a sweep picks up anyway), and then `unrung()` is called (say, to put the
    work back where a sweep finds it sooner). `traceparent`: the trace the task continues
    (default: the current span's; "": a trace of its own)."""
    doorbell_ring_all([ring_of(task_name, args, schema=schema, traceparent=traceparent,
                               unrung=unrung)], robust=robust)


def ring_of(task_name: str, args: Sequence = (), *, schema: str | None = None,
            traceparent: str | None = None, unrung: Callable[[], None] | None = None) -> Ring:
    """A ring whose schema and trace are taken now (defaults: the connection's schema, the
    current span), not at commit: a transaction that outlives its tenant_context commits (and
    rings) after the connection went back to public."""
    return Ring(task_name, list(args), schema or connection.schema_name,
                trace_parent() if traceparent is None else traceparent, unrung)


def doorbell_ring_all(rings: Sequence[Ring], *, robust: bool = False) -> None:
    """Send each on commit, in order, once: no publish retry (PostgreSQL is the truth: what is
    not sent is sent again by the tick or the watchdog, and a retry after a timed-out push that
    did arrive sent it twice). `robust`: nothing is raised; a ring that cannot be sent is
    unrung, and at the first the broker refuses (a connection error or a timeout) it is taken
    to be away: every ring after it is unrung too, not tried, and so are this process's next
    robust rings for BROKER_AWAY_SECONDS."""
    def send() -> None:
        if robust and _breaker.skip():
            log.warning("%d ring(s) not tried, the broker was away moments ago; the sweep "
                        "sends them", len(rings))
            for each in rings:
                if each.unrung is not None:
                    each.unrung()
            return
        try:
            for index, ring in enumerate(rings):
                try:
                    _send(ring)
                except Exception as exc:
                    away = _breaker.failed(exc)
                    if not robust:
                        raise
                    unsent = rings[index:] if away else [ring]
                    log.warning("%s%s%s: doorbell not rung; the sweep sends %s", ring.task_name,
                                ring.args, f" and {len(unsent) - 1} more" if away else "",
                                "them" if away else "it", exc_info=True)
                    for each in unsent:
                        if each.unrung is not None:
                            each.unrung()
                    if away:
                        return
                else:
                    _breaker.answered()
        finally:
            _breaker.probe_over()

    if rings:
        transaction.on_commit(send)


def _send(ring: Ring) -> None:
    headers = {"_schema_name": ring.schema}
    if ring.traceparent:
        headers["traceparent"] = ring.traceparent
    with trace_attached(ring.traceparent):
        # No result is ever read: without ignore_result Celery subscribes the sender to the
        # task's result channel (a round trip per send, one subscription kept per task, ~20 s
        # of reconnecting when Redis is away)
        app.send_task(ring.task_name, args=ring.args, headers=headers, ignore_result=True,
                      retry=False)


def doorbell_waiting(task_name: str) -> int | None:
    """How many messages wait in the broker in the queue `task_name` is sent to, taken by no
    worker yet; None if the broker cannot be asked (away: one try, no retry; or away moments
    ago, not tried)."""
    if _breaker.skip():
        return None
    queue = (task_route(task_name, None, None, {}) or {}).get(
        "queue", settings.CELERY_TASK_DEFAULT_QUEUE)
    try:
        with app.pool.acquire(block=True) as broker:
            try:
                broker.ensure_connection(max_retries=0)
                waiting = broker.default_channel.queue_declare(queue=queue,
                                                               passive=True).message_count
            except ChannelError:  # Redis keeps no empty list: no such queue is an empty one
                waiting = 0
            except Exception as exc:
                broker.collect()  # a connection that failed is not handed to the next caller
                if not _breaker.failed(exc):  # it answered with an error (a Redis ACL
                    # without EXISTS or LLEN), or the error is ours
                    log.warning("the broker cannot say what waits in %s", queue, exc_info=True)
                return None
        _breaker.answered()
        return waiting
    finally:
        _breaker.probe_over()
