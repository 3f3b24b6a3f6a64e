"""Ready-list reads for operators: how long the line is and how long its head has waited."""

from django.db import connection

from agentplatform.metrics import ReadyBacklog

from .models import ReadyRun

READY = f"public.{ReadyRun._meta.db_table}"


def ready_backlog() -> ReadyBacklog:
    """The whole ready list in one pass (it holds only runnable runs: small)."""
    with connection.cursor() as cursor:
        cursor.execute(f"""
            SELECT count(*) FILTER (WHERE dispatched_at IS NULL AND ready_at <= now()),
                   count(*) FILTER (WHERE dispatched_at IS NOT NULL),
                   count(*) FILTER (WHERE dispatched_at IS NULL AND ready_at > now()),
                   coalesce(extract(epoch FROM now() - min(ready_at)
                                    FILTER (WHERE dispatched_at IS NULL AND ready_at <= now())), 0)
              FROM {READY}
        """)
        waiting, dispatched, scheduled, oldest = cursor.fetchone()
    return ReadyBacklog(waiting=waiting, dispatched=dispatched, scheduled=scheduled,
                        oldest_waiting_seconds=float(oldest))
