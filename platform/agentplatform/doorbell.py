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
from collections.abc import Callable, Sequence

from django.db import connection, transaction

from agentplatform.celery import app
from agentplatform.telemetry import trace_attached, trace_parent

log = logging.getLogger(__name__)


def doorbell_ring(task_name: str, args: Sequence = (), *, schema: str | None = None,
                  robust: bool = False, traceparent: str | None = None,
                  unrung: Callable[[], None] | None = None) -> None:
    """Send `task_name(*args)` on commit. `robust`: a broker that is away is logged, not
    raised (for work a sweep picks up anyway), and then `unrung()` is called (say, to put the
    work back where a sweep finds it sooner). `traceparent`: the trace the task continues
    (default: the current span's; "": a trace of its own)."""
    # The schema is taken now, not at commit: a transaction that outlives its tenant_context
    # commits (and rings) after the connection went back to public.
    headers = {"_schema_name": schema or connection.schema_name}
    traceparent = trace_parent() if traceparent is None else traceparent
    if traceparent:
        headers["traceparent"] = traceparent

    def send() -> None:
        try:
            with trace_attached(traceparent):
                app.send_task(task_name, args=list(args), headers=headers)
        except Exception:
            if not robust:
                raise
            log.warning("%s%s: doorbell not rung; the sweep sends it", task_name, list(args),
                        exc_info=True)
            if unrung is not None:
                unrung()

    transaction.on_commit(send)
