"""Webhook verbs: connect a Slack workspace or a Gmail mailbox to a tenant; accept a Slack
event, a Slack button click or a Gmail push; deliver them from the inbox.

Accepting does everything in the request, in one transaction: verify; write the dedupe row (a
public-schema row per delivery id) and an inbox item holding the raw event or decision; deliver
it (`approvals.services.event_deliver`, `approval_decide`, in the tenant's schema: the run is
woken and, if fair dispatch picks it, its task is sent as this commits) and mark the item
delivered; only then answer 200. A delivery that raises is rolled back alone and leaves the item
pending; the beat sweep (`inbox_sweep`) rings `inbox_deliver` for it, retried with backoff, and
after WEBHOOK_INBOX_MAX_ATTEMPTS marks it failed (docs/decisions/0007-webhook-inbox.md,
0025-one-hop-wake-up.md).
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
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qs

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.db.models.functions import Now
from django.utils import timezone
from django_tenants.utils import tenant_context

from agentplatform.doorbell import doorbell_ring
from agentplatform.errors import ServiceError
from agentplatform.storable import json_shape
from runs.approvals.services import ApprovalError, approval_decide, event_deliver
from tenants.models import Tenant

from .models import (
    GmailConnection,
    GmailMessageSeen,
    InboxItem,
    SlackConnection,
    SlackEventSeen,
)
from .oidc import TokenRejected, google_token_verify
from .sealing import secret_open, secret_seal

log = logging.getLogger(__name__)


class WebhookRejected(ServiceError):
    """A delivery or connection refused before anything was recorded; the sender is answered
    with the status api_errors maps its code to."""


# -- connections -----------------------------------------------------------------------------

def _slack_secret_binding(connection_id: uuid.UUID) -> str:
    return f"webhooks.slack_connection:{connection_id}:signing_secret"


def slack_connection_create(*, tenant: Tenant, team_id: str, signing_secret: str,
                            approvals_channel: str = "") -> SlackConnection:
    if not signing_secret:
        raise WebhookRejected("invalid_request", "signing_secret is required.")
    if SlackConnection.objects.filter(tenant=tenant, team_id=team_id).exists():
        raise WebhookRejected("team_already_connected",
                              f"Slack team {team_id} is already connected.")
    connection_id = uuid.uuid4()
    try:
        with transaction.atomic():  # the seal's key version is held until the row commits
            sealed, version = secret_seal(tenant=tenant, plaintext=signing_secret,
                                          bound_to=_slack_secret_binding(connection_id))
            return SlackConnection.objects.create(
                id=connection_id, tenant=tenant, team_id=team_id, signing_secret_sealed=sealed,
                data_key_version=version, approvals_channel=approvals_channel)
    except IntegrityError:
        raise WebhookRejected("team_already_connected",
                              f"Slack team {team_id} is already connected.") from None


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
                              f"Mailbox {email} is already connected.") from None


def connection_delete(*, model: type[SlackConnection] | type[GmailConnection], tenant: Tenant,
                      connection_id: uuid.UUID) -> None:
    """Disconnect one of the tenant's Slack workspaces or mailboxes; not_found if it has none."""
    deleted, _ = model.objects.filter(tenant=tenant, id=connection_id).delete()
    if not deleted:
        raise WebhookRejected("not_found", "No such connection.")


def slack_secrets_reseal(*, tenant: Tenant, to_version: int) -> int:
    """Re-seal the signing secrets of the tenant's Slack connections under data key `to_version`
    (a key rotation). Idempotent; returns the connections changed."""
    changed = 0
    pending = (SlackConnection.objects.filter(tenant=tenant).exclude(data_key_version=to_version)
               .values_list("pk", flat=True))
    for pk in list(pending):
        with transaction.atomic():
            connection = (SlackConnection.objects.select_for_update().select_related("tenant")
                          .filter(pk=pk).first())
            if connection is None or connection.data_key_version == to_version:
                continue
            sealed, version = secret_seal(tenant=tenant, plaintext=slack_signing_secret(connection),
                                          bound_to=_slack_secret_binding(connection.id),
                                          version=to_version)
            SlackConnection.objects.filter(pk=pk).update(signing_secret_sealed=sealed,
                                                         data_key_version=version)
            changed += 1
    return changed


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
                              "X-Slack-Signature and X-Slack-Request-Timestamp are required.")
    try:
        if len(timestamp) > 20:  # no time: and past a float's range, `now - sent` overflows
            raise ValueError(timestamp)
        sent = int(timestamp)
    except ValueError:
        raise WebhookRejected("invalid_timestamp", "X-Slack-Request-Timestamp is not a number.") from None
    now = time.time() if now is None else now
    if abs(now - sent) > settings.SLACK_TIMESTAMP_WINDOW_SECONDS:
        raise WebhookRejected("stale_timestamp", "The request timestamp is outside the window.")
    expected = slack_signature(secret=slack_signing_secret(connection), timestamp=timestamp,
                               body=body)
    if not hmac.compare_digest(expected.encode(), signature.encode()):
        raise WebhookRejected("invalid_signature", "The request signature does not match.")


def _slack_object(value: Any, name: str) -> dict:
    """A nested object of a Slack event, absent or null read as empty; anything else refused."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise WebhookRejected("malformed_body", f"event.{name} is not an object.")
    return value


def slack_event_route(event: dict) -> tuple[str, str]:
    """(kind, key) of a Slack event for event gates: a correlation key the agent put in the
    message metadata wins, then the thread, then the channel (then the user). An event whose
    nested objects are not objects is refused (WebhookRejected), so it is never stored."""
    metadata = _slack_object(event.get("metadata"), "metadata")
    payload = _slack_object(metadata.get("event_payload"), "metadata.event_payload")
    item = _slack_object(event.get("item"), "item")
    key = (payload.get("correlation_key") or event.get("thread_ts") or event.get("channel")
           or item.get("channel") or event.get("user") or "")
    return f"slack.{event.get('type', 'unknown')}"[:64], str(key)[:255]


@dataclass(frozen=True)
class Accepted:
    duplicate: bool = False
    challenge: str | None = None


def _json(body: bytes | str, what: str = "The body") -> Any:
    """Parsed JSON that can be stored: nested at most API_JSON_MAX_DEPTH deep (far deeper is a
    RecursionError in Python's parser), no U+0000, no lone surrogate, no infinite number;
    anything else is malformed_body (400)."""
    try:
        value = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise WebhookRejected("malformed_body", f"{what} is not JSON.") from None
    except RecursionError:
        raise WebhookRejected("malformed_body", f"{what} is nested too deeply.") from None
    depth, unstorable = json_shape(value)
    if depth > settings.API_JSON_MAX_DEPTH:
        raise WebhookRejected("malformed_body", f"{what} is nested too deeply.")
    if unstorable:
        raise WebhookRejected("malformed_body", unstorable)
    return value


def slack_event_accept(*, connection: SlackConnection, body: bytes, headers) -> Accepted:
    """An Events API request: verified, answered (url_verification) or recorded and delivered
    once. Retries (X-Slack-Retry-Num) of an event already seen are duplicates;
    a retry of one we never recorded (we failed before) is accepted."""
    slack_request_verify(connection=connection, body=body,
                         timestamp=headers.get("X-Slack-Request-Timestamp"),
                         signature=headers.get("X-Slack-Signature"))
    payload = _json(body)
    if not isinstance(payload, dict):
        raise WebhookRejected("malformed_body", "The body is not a JSON object.")
    if payload.get("type") == "url_verification":
        return Accepted(challenge=str(payload.get("challenge", "")))
    if payload.get("type") != "event_callback":
        return Accepted()  # app_rate_limited and friends: nothing to resume
    event_id, event = payload.get("event_id"), payload.get("event")
    if not isinstance(event_id, str) or not event_id or not isinstance(event, dict):
        raise WebhookRejected("malformed_body", "event_callback needs event_id and event.")
    if len(event_id) > SlackEventSeen._meta.get_field("event_id").max_length:
        raise WebhookRejected("malformed_body", "event_id is too long.")
    slack_event_route(event)  # refused now, not retried forever by the inbox
    if payload.get("team_id") != connection.team_id:
        raise WebhookRejected("wrong_team", "The event is for another Slack team.")
    with transaction.atomic():
        try:
            with transaction.atomic():
                SlackEventSeen.objects.create(connection=connection, event_id=event_id)
                _inbox_put(tenant=connection.tenant, kind=InboxItem.Kind.SLACK_EVENT,
                           source_id=f"slack:{event_id}", payload=event)
        except IntegrityError:
            log.info("slack %s: duplicate event %s (retry %s, %s)", connection.id, event_id,
                     headers.get("X-Slack-Retry-Num", "-"), headers.get("X-Slack-Retry-Reason", "-"))
            return Accepted(duplicate=True)
    return Accepted()


def slack_interaction_accept(*, connection: SlackConnection, body: bytes, headers) -> int:
    """A button click (form field `payload`, type block_actions). Approve / Reject buttons carry
    the approval id; each decision is an inbox item, decided in this connection's tenant
    only. Slack may send the same interaction again: a decision already stored (same
    approval, action_ts and user) is a duplicate. Returns how many decisions were stored."""
    slack_request_verify(connection=connection, body=body,
                         timestamp=headers.get("X-Slack-Request-Timestamp"),
                         signature=headers.get("X-Slack-Signature"))
    try:
        field = parse_qs(body.decode())["payload"][0]
    except (KeyError, IndexError, ValueError, UnicodeDecodeError):
        raise WebhookRejected("malformed_body", "Expected a form field `payload` with JSON.") from None
    payload = _json(field, "The form field `payload`")
    if not isinstance(payload, dict):
        raise WebhookRejected("malformed_body", "`payload` is not a JSON object.")
    team, user, actions = (payload.get("team") or {}, payload.get("user") or {},
                           payload.get("actions") or [])
    if not (isinstance(team, dict) and isinstance(user, dict) and isinstance(actions, list)
            and all(isinstance(action, dict) for action in actions)):
        raise WebhookRejected("malformed_body", "team, user and each action must be objects.")
    if team.get("id") != connection.team_id:
        raise WebhookRejected("wrong_team", "The interaction is for another Slack team.")
    if payload.get("type") != "block_actions":
        return 0
    user = user.get("id", "")
    stored = 0
    for action in actions:
        if action.get("action_id") not in ("approve", "reject"):
            continue
        try:
            approval_id = str(uuid.UUID(str(action.get("value"))))
        except ValueError:
            log.warning("slack %s: button %s carries no approval id", connection.id,
                        action.get("action_id"))
            continue
        # action_ts is unique per click; a resent interaction repeats it.
        click = action.get("action_ts") or payload.get("trigger_id") or \
            hashlib.sha256(body).hexdigest()
        decision = {"approval_id": approval_id, "approve": action["action_id"] == "approve",
                    "by": f"slack:{user}"}
        try:
            with transaction.atomic():
                _inbox_put(tenant=connection.tenant, kind=InboxItem.Kind.SLACK_DECISION,
                           source_id=f"slack-decision:{approval_id}:{user}:{click}"[:255],
                           payload=decision)
        except IntegrityError:
            log.info("slack %s: duplicate decision on approval %s by %s", connection.id,
                     approval_id, user)
            continue
        stored += 1
    return stored


# -- Gmail -----------------------------------------------------------------------------------

def gmail_push_accept(*, connection: GmailConnection, body: bytes, authorization: str) -> bool:
    """A Pub/Sub push: the OIDC token verified against this connection, the message decoded,
    recorded and delivered once by messageId. Returns False for a duplicate."""
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise WebhookRejected("missing_token", "Send the push's OIDC token as a Bearer token.")
    try:
        google_token_verify(token=token.strip(), audience=connection.audience,
                            email=connection.service_account_email)
    except TokenRejected as exc:
        raise WebhookRejected(exc.code, exc.message) from None
    envelope = _json(body)
    message = envelope.get("message") if isinstance(envelope, dict) else None
    if not isinstance(message, dict):
        raise WebhookRejected("malformed_body", "Expected a Pub/Sub push envelope.")
    message_id = message.get("messageId") or message.get("message_id")
    try:
        data = _json(base64.b64decode(message.get("data") or "", validate=True), "message.data")
        mailbox, history_id = str(data["emailAddress"]).strip().lower(), data["historyId"]
    except (binascii.Error, ValueError, TypeError, KeyError, UnicodeDecodeError):
        raise WebhookRejected("malformed_body",
                              "message.data must be base64 JSON with emailAddress and historyId.") from None
    if not isinstance(message_id, str) or not message_id:
        raise WebhookRejected("malformed_body", "message.messageId is required.")
    if mailbox != connection.email:
        raise WebhookRejected("wrong_mailbox", "The notification is for another mailbox.")
    with transaction.atomic():
        try:
            with transaction.atomic():
                GmailMessageSeen.objects.create(connection=connection, message_id=message_id)
                _inbox_put(tenant=connection.tenant, kind=InboxItem.Kind.GMAIL_PUSH,
                           source_id=f"gmail:{message_id}",
                           payload={"mailbox": mailbox, "historyId": history_id,
                                    "messageId": message_id})
        except IntegrityError:
            log.info("gmail %s: duplicate message %s", connection.id, message_id)
            return False
    return True


# -- the inbox -------------------------------------------------------------------------------

def _inbox_put(*, tenant: Tenant, kind: str, source_id: str, payload: dict) -> InboxItem:
    """Store an accepted delivery (inside the caller's transaction, with its dedupe row) and
    deliver it there too: the event wakes its run, whose task is sent as this commits (one hop
    to a worker). A delivery that fails is rolled back alone and leaves the item pending, with
    backoff, for the sweep."""
    item = InboxItem.objects.create(tenant=tenant, kind=kind, source_id=source_id,
                                    payload=payload)
    _inbox_attempt(item)
    return item


def _inbox_ring(item_id: int) -> None:
    # public schema: the item names its tenant; a broker that is away: the sweep delivers it
    doorbell_ring("webhooks.inbox_deliver", [item_id], robust=True)


def _inbox_work(item: InboxItem) -> str:
    """The tenant work of one item, in its tenant's schema; returns the outcome to record."""
    payload = item.payload
    match item.kind:
        case InboxItem.Kind.SLACK_EVENT:
            kind, key = slack_event_route(payload)
            delivery = event_deliver(kind=kind, key=key, payload=payload,
                                     source_id=item.source_id, received_at=item.received_at)
        case InboxItem.Kind.GMAIL_PUSH:
            delivery = event_deliver(
                kind="gmail", key=payload["mailbox"], source_id=item.source_id,
                payload={"historyId": payload["historyId"], "messageId": payload["messageId"]},
                received_at=item.received_at)
        case InboxItem.Kind.SLACK_DECISION:
            approve = payload["approve"]
            try:  # expired or not is decided at the click's acceptance, not at its delivery
                approval_decide(approval_id=uuid.UUID(payload["approval_id"]), approve=approve,
                                by=payload["by"], at=item.received_at)
            except ApprovalError as exc:  # stale or not ours: an answer, not a failure
                log.warning("slack decision on approval %s in %s by %s refused: %s",
                            payload["approval_id"], item.tenant.schema_name, payload["by"],
                            exc.code)
                return exc.code
            return "approved" if approve else "rejected"
    if delivery.duplicate:
        return "duplicate"
    return f"resumed {len(delivery.resumed)}"


def inbox_deliver(*, item_id: int) -> str | None:
    """Deliver one pending item (a sweep's doorbell): the tenant work and marking it delivered
    commit together, so it is delivered once. Returns the outcome, or None if it was delivered
    already, is being delivered, must wait for its retry time, or failed."""
    with transaction.atomic():
        item = (InboxItem.objects.select_for_update(skip_locked=True, of=("self",))
                .select_related("tenant")
                .filter(id=item_id, status=InboxItem.Status.PENDING)
                .filter(Q(attempts=0) | Q(next_attempt_at__lte=Now())).first())
        if item is None:
            return None
        return _inbox_attempt(item)


def _inbox_attempt(item: InboxItem) -> str | None:
    """One delivery attempt of an item this transaction holds (it just wrote it, or locked it):
    the tenant work in a savepoint, then the item marked delivered. A failure rolls back the
    tenant work only and leaves the item pending with backoff, or after
    WEBHOOK_INBOX_MAX_ATTEMPTS marks it failed with the error as its outcome (then None)."""
    try:
        with transaction.atomic(), tenant_context(item.tenant):
            outcome = _inbox_work(item)
    except Exception as exc:  # not acked away: the item stays pending and is retried
        error = f"{type(exc).__name__}: {exc}"
        attempts = item.attempts + 1
        if attempts >= settings.WEBHOOK_INBOX_MAX_ATTEMPTS:  # a poison item stops here
            log.error("inbox item %s (%s) failed %d times, giving up: %s", item.id,
                      item.source_id, attempts, exc, exc_info=True)
            InboxItem.objects.filter(id=item.id).update(
                status=InboxItem.Status.FAILED, outcome=error[:64], attempts=attempts,
                last_error=error[:4000])
            return None
        delay = min(settings.WEBHOOK_INBOX_BACKOFF_SECONDS * 2 ** item.attempts,
                    settings.WEBHOOK_INBOX_BACKOFF_MAX_SECONDS)
        log.warning("inbox item %s (%s) failed, retrying in %.1fs: %s", item.id,
                    item.source_id, delay, exc, exc_info=True)
        InboxItem.objects.filter(id=item.id).update(
            attempts=attempts, last_error=error[:4000],
            next_attempt_at=Now() + timedelta(seconds=delay))
        return None
    InboxItem.objects.filter(id=item.id).update(
        status=InboxItem.Status.DELIVERED, outcome=outcome[:64], attempts=item.attempts + 1,
        delivered_at=Now())
    return outcome


def inbox_sweep(*, limit: int = 500) -> int:
    """Ring the doorbell of every pending item that is due and no younger than
    WEBHOOK_INBOX_SWEEP_AFTER_SECONDS (younger ones have a doorbell on its way)."""
    young = Now() - timedelta(seconds=settings.WEBHOOK_INBOX_SWEEP_AFTER_SECONDS)
    due = list(InboxItem.objects.filter(status=InboxItem.Status.PENDING, next_attempt_at__lte=Now())
               .filter(Q(attempts__gt=0) | Q(received_at__lte=young))
               .order_by("next_attempt_at").values_list("id", flat=True)[:limit])
    for item_id in due:
        _inbox_ring(item_id)
    return len(due)


def inbox_prune(*, now=None) -> dict[str, int]:
    """Delete delivered and failed items and Slack/Gmail dedupe rows older than
    EVENT_DEDUPE_RETENTION_SECONDS (longer than any sender retries). Pending items stay."""
    cutoff = (now or timezone.now()) - timedelta(seconds=settings.EVENT_DEDUPE_RETENTION_SECONDS)
    return {
        "inbox_items": InboxItem.objects.filter(
            status__in=[InboxItem.Status.DELIVERED, InboxItem.Status.FAILED],
            received_at__lt=cutoff).delete()[0],
        "slack_events_seen": SlackEventSeen.objects.filter(received_at__lt=cutoff).delete()[0],
        "gmail_messages_seen": GmailMessageSeen.objects.filter(received_at__lt=cutoff)
        .delete()[0],
    }
