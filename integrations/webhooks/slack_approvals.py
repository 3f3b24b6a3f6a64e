"""The Slack message that announces a pending approval: Block Kit with the title, a summary of
the artifact, and Approve / Reject buttons carrying the approval id (decided back through
/webhooks/slack/<connection>/interactivity). It goes out through the effect outbox, so the
`slack` connector delivers it at least once with an idempotency key, once at Slack."""

import json
import logging
from uuid import UUID

from django.db import connection

from runs.approvals.models import Approval
from runs.effects.services import outbox_enqueue
from tenants.models import Tenant

from .models import SlackConnection

log = logging.getLogger(__name__)

SUMMARY_MAX_CHARS = 2500  # a section's text may hold 3000


def artifact_summary(artifact) -> str:
    if artifact in (None, "", {}, []):
        return "_(no artifact)_"
    text = artifact if isinstance(artifact, str) else json.dumps(artifact, indent=2,
                                                                 sort_keys=True, default=str)
    if len(text) > SUMMARY_MAX_CHARS:
        text = text[:SUMMARY_MAX_CHARS] + "\n…"
    return f"```{text}```"


def approval_message_build(*, approval, channel: str) -> dict:
    """chat.postMessage arguments (channel, text, blocks) for a pending approval."""
    title = approval.request.get("title") or "Approval requested"
    body = approval.request.get("body") or ""
    approval_id = str(approval.id)
    lines = [f"*{title}*"] + ([body] if body else [])
    context = [f"run `{approval.run_id}`"]
    if approval.deciders:
        context.append("may decide: " + ", ".join(approval.deciders))
    if approval.expires_at:
        context.append(f"expires {approval.expires_at:%Y-%m-%d %H:%M} UTC")
    blocks = [
        {"type": "section", "text": {"type": "mrkdwn", "text": "\n".join(lines)[:3000]}},
        {"type": "section",
         "text": {"type": "mrkdwn", "text": artifact_summary(approval.request.get("artifact"))}},
        {"type": "context", "elements": [{"type": "mrkdwn", "text": " · ".join(context)}]},
        {"type": "actions", "block_id": f"approval:{approval_id}", "elements": [
            {"type": "button", "action_id": "approve", "style": "primary", "value": approval_id,
             "text": {"type": "plain_text", "text": "Approve"}},
            {"type": "button", "action_id": "reject", "style": "danger", "value": approval_id,
             "text": {"type": "plain_text", "text": "Reject"}},
        ]},
    ]
    return {"channel": channel, "text": f"Approval requested: {title}", "blocks": blocks}


def slack_approval_announce(approval_id: UUID) -> None:
    """An ANNOUNCERS hook (approvals.services): post the approval to each of the tenant's Slack
    approvals channels, through the outbox. Runs in the tenant's schema."""


    approval = Approval.objects.filter(id=approval_id).first()
    if approval is None or approval.kind != Approval.Kind.APPROVAL:
        return
    tenant = Tenant.objects.filter(schema_name=connection.schema_name).first()
    channels = list(SlackConnection.objects.filter(tenant=tenant).exclude(approvals_channel="")
                    .values_list("approvals_channel", flat=True)) if tenant else []
    if not channels:
        return

    for channel in channels:
        outbox_enqueue(run_id=approval.run_id, name=f"slack_approval:{approval.id}:{channel}",
                       connector="slack",
                       args=approval_message_build(approval=approval, channel=channel))
