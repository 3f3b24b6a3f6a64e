"""Webhook verbs: connect a Slack workspace or a Gmail mailbox to a tenant; accept a Slack
event, a Slack button click or a Gmail push.

Accepting is fast and does no tenant work: verify, deduplicate (a public-schema row per
delivery id), and enqueue a task that carries the tenant's schema header. The task delivers
the event (`approvals.services.event_deliver`, idempotent by source_id) or decides the
approval in the tenant's schema. The dedupe row and the enqueue share one transaction: if the
broker refuses the message, the row is rolled back and the sender's retry is not a duplicate.
"""

import base64
import binascii
import hashlib
import hmac
import json
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django_tenants.utils import tenant_context

from tenants.models import Tenant

from .models import GmailConnection, GmailMessageSeen, SlackConnection, SlackEventSeen
from .oidc import TokenRejected, google_token_verify
from .sealing import secret_open, secret_seal

log = logging.getLogger(__name__)


class WebhookRejected(Exception):
    """A delivery refused before anything was recorded; `http_status` goes to the sender."""

    def __init__(self, code: str, message: str, http_status: int):
        super().__init__(message)
        self.code, self.message, self.http_status = code, message, http_status


# -- connections -----------------------------------------------------------------------------

def _slack_secret_binding(connection_id: uuid.UUID) -> str:
    return f"webhooks.slack_connection:{connection_id}:signing_secret"


def slack_connection_create(*, tenant: Tenant, team_id: str, signing_secret: str,
                            approvals_channel: str = "") -> SlackConnection:
    if not signing_secret:
        raise WebhookRejected("invalid_request", "signing_secret is required.", 400)
    if SlackConnection.objects.filter(tenant=tenant, team_id=team_id).exists():
        raise WebhookRejected("team_already_connected",
                              f"Slack team {team_id} is already connected.", 409)
    connection_id = uuid.uuid4()
    sealed, version = secret_seal(tenant=tenant, plaintext=signing_secret,
                                  bound_to=_slack_secret_binding(connection_id))
    try:
        return SlackConnection.objects.create(
            id=connection_id, tenant=tenant, team_id=team_id, signing_secret_sealed=sealed,
            data_key_version=version, approvals_channel=approvals_channel)
    except IntegrityError:
        raise WebhookRejected("team_already_connected",
                              f"Slack team {team_id} is already connected.", 409) from None


def gmail_connection_create(*, tenant: Tenant, email: str, audience: str,
                            service_account_email: str) -> GmailConnection:
    email = email.strip().lower()
    try:
        with transaction.atomic():
            return GmailConnection.objects.create(
                tenant=tenant, email=email, audience=audience,
                service_account_email=service_account_email)
    except IntegrityError:
        raise WebhookRejected("mailbox_already_connected",
                              f"Mailbox {email} is already connected.", 409) from None


def slack_signing_secret(connection: SlackConnection) -> str:
    return secret_open(tenant=connection.tenant, sealed=connection.signing_secret_sealed,
                       version=connection.data_key_version,
                       bound_to=_slack_secret_binding(connection.id))


# -- Slack -----------------------------------------------------------------------------------

def slack_signature(*, secret: str, timestamp: str, body: bytes) -> str:
    basestring = b"v0:" + timestamp.encode() + b":" + body
    return "v0=" + hmac.new(secret.encode(), basestring, hashlib.sha256).hexdigest()


def slack_request_verify(*, connection: SlackConnection, timestamp: str | None,
                         signature: str | None, body: bytes, now: float | None = None) -> None:
    """Slack's v0 request signing, and a timestamp within the window either way (replays)."""
    if not timestamp or not signature:
        raise WebhookRejected("missing_signature",
                              "X-Slack-Signature and X-Slack-Request-Timestamp are required.", 401)
    try:
        sent = int(timestamp)
    except ValueError:
        raise WebhookRejected("invalid_timestamp", "X-Slack-Request-Timestamp is not a number.",
                              401) from None
    now = time.time() if now is None else now
    if abs(now - sent) > settings.SLACK_TIMESTAMP_WINDOW_SECONDS:
        raise WebhookRejected("stale_timestamp", "The request timestamp is outside the window.",
                              401)
    expected = slack_signature(secret=slack_signing_secret(connection), timestamp=timestamp,
                               body=body)
    if not hmac.compare_digest(expected.encode(), signature.encode()):
        raise WebhookRejected("invalid_signature", "The request signature does not match.", 401)


def slack_event_route(event: dict) -> tuple[str, str]:
    """(kind, key) of a Slack event for event gates: a correlation key the agent put in the
    message metadata wins, then the thread, then the channel (then the user)."""
    metadata = (event.get("metadata") or {}).get("event_payload") or {}
    key = (metadata.get("correlation_key") or event.get("thread_ts") or event.get("channel")
           or event.get("item", {}).get("channel") or event.get("user") or "")
    return f"slack.{event.get('type', 'unknown')}"[:64], str(key)[:255]


@dataclass(frozen=True)
class Accepted:
    duplicate: bool = False
    challenge: str | None = None


def _json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise WebhookRejected("malformed_body", "The body is not JSON.", 400) from None


def slack_event_accept(*, connection: SlackConnection, body: bytes, headers) -> Accepted:
    """An Events API request: verified, answered (url_verification) or recorded once and
    handed to a worker. Retries (X-Slack-Retry-Num) of an event already seen are duplicates;
    a retry of one we never recorded (we failed before) is accepted."""
    slack_request_verify(connection=connection, body=body,
                         timestamp=headers.get("X-Slack-Request-Timestamp"),
                         signature=headers.get("X-Slack-Signature"))
    payload = _json(body)
    if not isinstance(payload, dict):
        raise WebhookRejected("malformed_body", "The body is not a JSON object.", 400)
    if payload.get("type") == "url_verification":
        return Accepted(challenge=str(payload.get("challenge", "")))
    if payload.get("type") != "event_callback":
        return Accepted()  # app_rate_limited and friends: nothing to resume
    event_id, event = payload.get("event_id"), payload.get("event")
    if not isinstance(event_id, str) or not event_id or not isinstance(event, dict):
        raise WebhookRejected("malformed_body", "event_callback needs event_id and event.", 400)
    if payload.get("team_id") != connection.team_id:
        raise WebhookRejected("wrong_team", "The event is for another Slack team.", 403)
    from .tasks import slack_event_deliver

    with transaction.atomic():
        try:
            with transaction.atomic():
                SlackEventSeen.objects.create(connection=connection, event_id=event_id)
        except IntegrityError:
            log.info("slack %s: duplicate event %s (retry %s, %s)", connection.id, event_id,
                     headers.get("X-Slack-Retry-Num", "-"), headers.get("X-Slack-Retry-Reason", "-"))
            return Accepted(duplicate=True)
        with tenant_context(connection.tenant):
            slack_event_deliver.delay(event_id, event)
    return Accepted()


def slack_interaction_accept(*, connection: SlackConnection, body: bytes, headers) -> int:
    """A button click (form field `payload`, type block_actions). Approve / Reject buttons carry
    the approval id; a worker decides it in this connection's tenant only. Returns how many
    decisions were enqueued."""
    from urllib.parse import parse_qs

    from .tasks import slack_approval_decide

    slack_request_verify(connection=connection, body=body,
                         timestamp=headers.get("X-Slack-Request-Timestamp"),
                         signature=headers.get("X-Slack-Signature"))
    try:
        payload = json.loads(parse_qs(body.decode())["payload"][0])
    except (KeyError, IndexError, ValueError, UnicodeDecodeError):
        raise WebhookRejected("malformed_body", "Expected a form field `payload` with JSON.",
                              400) from None
    if not isinstance(payload, dict):
        raise WebhookRejected("malformed_body", "`payload` is not a JSON object.", 400)
    if (payload.get("team") or {}).get("id") != connection.team_id:
        raise WebhookRejected("wrong_team", "The interaction is for another Slack team.", 403)
    if payload.get("type") != "block_actions":
        return 0
    user = (payload.get("user") or {}).get("id", "")
    decisions = []
    for action in payload.get("actions") or []:
        if action.get("action_id") not in ("approve", "reject"):
            continue
        try:
            approval_id = str(uuid.UUID(str(action.get("value"))))
        except ValueError:
            log.warning("slack %s: button %s carries no approval id", connection.id,
                        action.get("action_id"))
            continue
        decisions.append((approval_id, action["action_id"] == "approve"))
    with tenant_context(connection.tenant):
        for approval_id, approve in decisions:
            slack_approval_decide.delay(approval_id, approve, f"slack:{user}")
    return len(decisions)


# -- Gmail -----------------------------------------------------------------------------------

def gmail_push_accept(*, connection: GmailConnection, body: bytes, authorization: str) -> bool:
    """A Pub/Sub push: the OIDC token verified against this connection, the message decoded,
    recorded once by messageId and handed to a worker. Returns False for a duplicate."""
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise WebhookRejected("missing_token", "Send the push's OIDC token as a Bearer token.", 401)
    try:
        google_token_verify(token=token.strip(), audience=connection.audience,
                            email=connection.service_account_email)
    except TokenRejected as exc:
        raise WebhookRejected(exc.code, exc.message, exc.http_status) from None
    envelope = _json(body)
    message = envelope.get("message") if isinstance(envelope, dict) else None
    if not isinstance(message, dict):
        raise WebhookRejected("malformed_body", "Expected a Pub/Sub push envelope.", 400)
    message_id = message.get("messageId") or message.get("message_id")
    try:
        data = json.loads(base64.b64decode(message.get("data") or "", validate=True))
        mailbox, history_id = str(data["emailAddress"]).strip().lower(), data["historyId"]
    except (binascii.Error, ValueError, TypeError, KeyError, UnicodeDecodeError):
        raise WebhookRejected("malformed_body",
                              "message.data must be base64 JSON with emailAddress and historyId.",
                              400) from None
    if not isinstance(message_id, str) or not message_id:
        raise WebhookRejected("malformed_body", "message.messageId is required.", 400)
    if mailbox != connection.email:
        raise WebhookRejected("wrong_mailbox", "The notification is for another mailbox.", 403)
    from .tasks import gmail_deliver

    with transaction.atomic():
        try:
            with transaction.atomic():
                GmailMessageSeen.objects.create(connection=connection, message_id=message_id)
        except IntegrityError:
            log.info("gmail %s: duplicate message %s", connection.id, message_id)
            return False
        with tenant_context(connection.tenant):
            gmail_deliver.delay(mailbox, history_id, message_id)
    return True
