"""Webhook work in the tenant's schema (the task's schema header), off the request path."""

import logging
from uuid import UUID

from celery import shared_task

from runs.tasks import tenant_schema

log = logging.getLogger(__name__)


@shared_task(name="webhooks.slack_event_deliver")
def slack_event_deliver(event_id: str, event: dict) -> list[str]:
    from approvals.services import event_deliver

    from .services import slack_event_route

    tenant_schema()
    kind, key = slack_event_route(event)
    delivery = event_deliver(kind=kind, key=key, payload=event, source_id=f"slack:{event_id}")
    return [str(run_id) for run_id in delivery.resumed]


@shared_task(name="webhooks.slack_approval_decide")
def slack_approval_decide(approval_id: str, approve: bool, by: str) -> str:
    """Decide in this tenant only: another tenant's approval id is simply not found here."""
    from approvals.services import ApprovalError, approval_decide

    schema = tenant_schema()
    try:
        approval_decide(approval_id=UUID(approval_id), approve=approve, by=by)
    except ApprovalError as exc:
        log.warning("slack decision on approval %s in %s by %s refused: %s", approval_id, schema,
                    by, exc.code)
        return exc.code
    return "approved" if approve else "rejected"


@shared_task(name="webhooks.gmail_deliver")
def gmail_deliver(mailbox: str, history_id, message_id: str) -> list[str]:
    from approvals.services import event_deliver

    tenant_schema()
    delivery = event_deliver(kind="gmail", key=mailbox,
                             payload={"historyId": history_id, "messageId": message_id},
                             source_id=f"gmail:{message_id}")
    return [str(run_id) for run_id in delivery.resumed]
