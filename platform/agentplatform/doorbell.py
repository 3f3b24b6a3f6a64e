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
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from django.conf import settings
from django.db import connection, transaction
from kombu.exceptions import ChannelError, OperationalError

from agentplatform.celery import app, task_route
from agentplatform.telemetry import trace_attached, trace_parent

log = logging.getLogger(__name__)
# What a send raises when the broker cannot be reached (Celery re-raises the transport's
# connection errors as kombu's OperationalError).
BROKER_AWAY = (OperationalError, OSError)
# Until when this process takes the broker to be away (time.monotonic()): after a send or an
# ask failed for want of it, robust rings are unrung and asks answered None without trying,
# for BROKER_AWAY_SECONDS, so a broker that hangs costs one request its socket timeouts, not
# every request of every thread in turn.
_away_until = 0.0


def _broker_away() -> bool:
    return time.monotonic() < _away_until


def _broker_gone() -> None:
    global _away_until
    _away_until = time.monotonic() + settings.BROKER_AWAY_SECONDS


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
        if robust and _broker_away():
            log.warning("%d ring(s) not tried, the broker was away moments ago; the sweep "
                        "sends them", len(rings))
            for each in rings:
                if each.unrung is not None:
                    each.unrung()
            return
        for index, ring in enumerate(rings):
            headers = {"_schema_name": ring.schema}
            if ring.traceparent:
                headers["traceparent"] = ring.traceparent
            try:
                with trace_attached(ring.traceparent):
                    # No result is ever read: without ignore_result Celery subscribes the
                    # sender to the task's result channel (a round trip per send, one
                    # subscription kept per task, ~20 s of reconnecting when Redis is away)
                    app.send_task(ring.task_name, args=ring.args, headers=headers,
                                  ignore_result=True, retry=False)
            except Exception as exc:
                away = isinstance(exc, BROKER_AWAY)
                if away:
                    _broker_gone()
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

    if rings:
        transaction.on_commit(send)


def doorbell_waiting(task_name: str) -> int | None:
    """How many messages wait in the broker in the queue `task_name` is sent to, taken by no
    worker yet; None if the broker cannot be asked (away: one try, no retry; or away moments
    ago, not tried)."""
    if _broker_away():
        return None
    queue = (task_route(task_name, None, None, {}) or {}).get(
        "queue", settings.CELERY_TASK_DEFAULT_QUEUE)
    with app.pool.acquire(block=True) as broker:
        try:
            broker.ensure_connection(max_retries=0)
            return broker.default_channel.queue_declare(queue=queue, passive=True).message_count
        except ChannelError:  # Redis keeps no empty list: no such queue is an empty one
            return 0
        except (*BROKER_AWAY, *broker.connection_errors):
            broker.collect()  # a connection that broke is not handed to the next caller
            _broker_gone()
            return None
        except Exception:  # it answered with an error (a Redis ACL without EXISTS or LLEN)
            log.warning("the broker cannot say what waits in %s", queue, exc_info=True)
            return None
