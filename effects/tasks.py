"""Outbox delivery tasks: per tenant (schema header), and a beat sweep across tenants."""

from celery import shared_task
from django_tenants.utils import tenant_context

from tenants.models import Tenant

from . import services


@shared_task(name="effects.outbox_deliver_due", ignore_result=True)
def outbox_deliver_due() -> None:
    """Deliver this tenant's due outbox messages."""
    from runs.tasks import tenant_schema

    tenant_schema()
    for message_id in services.outbox_due_ids():
        services.outbox_deliver(message_id=message_id)


@shared_task(name="effects.outbox_sweep", ignore_result=True)
def outbox_sweep() -> None:
    """Beat: ring each tenant that has due messages (retries after backoff, lost kicks)."""
    for tenant in Tenant.objects.filter(status=Tenant.Status.ACTIVE).exclude(provisioned_at=None):
        with tenant_context(tenant):
            if services.outbox_due_ids(limit=1):
                outbox_deliver_due.delay()
