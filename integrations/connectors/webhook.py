"""A generic webhook: POST a JSON body, signed, with our idempotency key.

args: url (optional when the credential has one), payload (any JSON value), event (optional,
sent as X-Agentplatform-Event).
credentials: signing_secret (required), optionally url.
result: {"status": 200, "body": <the receiver's JSON answer, or its text cut to 2 KB>}.

Headers sent:
  Idempotency-Key: <key>              the receiver deduplicates by it (we rely on that)
  X-Agentplatform-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<raw body>")>
A receiver recomputes v1 over the raw body it received, compares in constant time, and rejects
a timestamp older than a few minutes (replays).
"""

import hashlib
import hmac
import json
import time
from typing import Any

from . import transport
from .base import Call, Connector, ConnectorError, connector_register

SIGNATURE_HEADER = "X-Agentplatform-Signature"
BODY_ECHO_MAX = 2048
RETRYABLE_STATUS = {408, 409, 425, 429}


def signature(secret: str, timestamp: int, body: bytes) -> str:
    digest = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={digest}"


def signature_verify(secret: str, header: str, body: bytes, *, tolerance: float = 300) -> bool:
    """What a receiver does (and our tests): check v1 and that t is recent."""
    fields = dict(part.split("=", 1) for part in header.split(",") if "=" in part)
    try:
        timestamp = int(fields["t"])
    except (KeyError, ValueError):
        return False
    if abs(time.time() - timestamp) > tolerance:
        return False
    return hmac.compare_digest(signature(secret, timestamp, body), header)


class WebhookConnector(Connector):
    name = "webhook"
    honours_idempotency_key = True
    credential_strings = ("signing_secret", "url")

    def execute(self, call: Call) -> dict[str, Any]:
        url = call.args.get("url") or call.credentials.get("url")
        secret = call.credentials.get("signing_secret")
        if not url:
            raise ConnectorError("webhook: no 'url' in the args or the credential", retryable=False)
        if not secret:
            raise ConnectorError("webhook: no signing_secret in the tenant's webhook credential",
                                 retryable=False)
        body = json.dumps(call.args.get("payload"), separators=(",", ":"), sort_keys=True).encode()
        headers = {
            "Content-Type": "application/json",
            "Idempotency-Key": call.idempotency_key,
            SIGNATURE_HEADER: signature(secret, int(time.time()), body),
            "User-Agent": "agentplatform-webhook/1",
        }
        if call.args.get("event"):
            headers["X-Agentplatform-Event"] = str(call.args["event"])
        response = transport.request("POST", url, headers=headers, body=body, receiver="webhook")
        if response.status >= 500:
            raise ConnectorError(f"webhook: HTTP {response.status}; it may have been acted on",
                                 retryable=True, sent=True)
        if response.status >= 400:
            retryable = response.status in RETRYABLE_STATUS
            raise ConnectorError(f"webhook: HTTP {response.status}{response.retry_after()}",
                                 retryable=retryable, sent=True)
        answer = response.json()
        if answer is None and response.body:
            answer = response.body[:BODY_ECHO_MAX].decode(errors="replace")
        return {"status": response.status, "body": answer}


connector_register(WebhookConnector())
