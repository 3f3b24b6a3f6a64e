"""Outbox delivery tasks: per tenant (schema header), and a beat sweep of the due tenants. They run
on CELERY_OUTBOX_QUEUE (agentplatform.celery.task_route), never in the slots runs need."""

from celery import shared_task

from runs.engine import worker_id
from tenants.selection import tenant_schema

from . import services

OUTBOX_BATCH = 100  # messages per task


@shared_task(name="effects.outbox_deliver_due", ignore_result=True)
def outbox_deliver_due() -> None:
    """Deliver this tenant's due outbox messages, each under a claim of its own (several of
    these run at once and never take the same message)."""
    tenant_schema()
    for _ in range(OUTBOX_BATCH):
        if services.outbox_deliver_next(owner=worker_id()) is None:
            return
    outbox_deliver_due.delay()  # more are due: a fresh task, so other tenants get turns too


@shared_task(name="effects.outbox_sweep", ignore_result=True)
def outbox_sweep() -> None:
    """Beat: ring each tenant that has due messages (retries after backoff, lost kicks), found
    in the due-index in public, not by visiting every tenant's schema."""
    services.outbox_sweep()
