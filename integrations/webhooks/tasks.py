"""Webhook work off the request path: the inbox sweep and its doorbell, which retry items whose
delivery in the request failed (public schema; each item names its tenant), and the tasks an
older version enqueued (tenant schema header)."""

import logging
from uuid import UUID

from celery import shared_task
from django.db import connection

from runs.approvals.services import ApprovalError, approval_decide, event_deliver
from tenants.selection import tenant_schema

from . import services

log = logging.getLogger(__name__)


@shared_task(name="webhooks.inbox_deliver")
def inbox_deliver(item_id: int) -> str | None:
    connection.set_schema_to_public()
    return services.inbox_deliver(item_id=item_id)


@shared_task(name="webhooks.inbox_sweep", ignore_result=True)
def inbox_sweep() -> int:
    connection.set_schema_to_public()
    return services.inbox_sweep()


# -- enqueued before the inbox existed: kept for one release, for messages still in the broker --

@shared_task(name="webhooks.slack_event_deliver")
def slack_event_deliver(event_id: str, event: dict) -> list[str]:
    tenant_schema()
    kind, key = services.slack_event_route(event)
    delivery = event_deliver(kind=kind, key=key, payload=event, source_id=f"slack:{event_id}")
    return [str(run_id) for run_id in delivery.resumed]


@shared_task(name="webhooks.slack_approval_decide")
def slack_approval_decide(approval_id: str, approve: bool, by: str) -> str:
    tenant_schema()
    try:
        approval_decide(approval_id=UUID(approval_id), approve=approve, by=by)
    except ApprovalError as exc:
        return exc.code
    return "approved" if approve else "rejected"


@shared_task(name="webhooks.gmail_deliver")
def gmail_deliver(mailbox: str, history_id, message_id: str) -> list[str]:
    tenant_schema()
    delivery = event_deliver(kind="gmail", key=mailbox,
                             payload={"historyId": history_id, "messageId": message_id},
                             source_id=f"gmail:{message_id}")
    return [str(run_id) for run_id in delivery.resumed]
