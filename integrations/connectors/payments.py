"""Payments through a Stripe-style API: `POST /v1/charges`, form-encoded, with Idempotency-Key.

args: amount (integer, smallest currency unit), currency, and source or customer; optionally
description, metadata (a flat object of strings).
credentials: secret_key (sk_...), optionally api_url (else STRIPE_API_URL).
result: {"id": "ch_...", "amount": 2000, "currency": "usd", "status": "succeeded", "paid": true,
"replayed": false} (replayed: Stripe answered from its idempotency store).

Stripe keeps the first answer for a key (success or error) for at least 24 hours and replays it,
so an attempt interrupted by a crash is simply sent again with the same key.
"""

from typing import Any
from urllib.parse import urlencode

from django.conf import settings

from . import transport
from .base import Call, Connector, ConnectorError, connector_register

FIELDS = ("amount", "currency", "source", "customer", "description", "receipt_email",
          "statement_descriptor")


def form_encode(params: dict[str, Any]) -> bytes:
    """Stripe's form encoding: nested objects as `metadata[order]=42`."""
    pairs: list[tuple[str, str]] = []
    for key, value in params.items():
        if isinstance(value, dict):
            pairs += [(f"{key}[{inner}]", str(item)) for inner, item in value.items()]
        elif isinstance(value, bool):
            pairs.append((key, "true" if value else "false"))
        elif value is not None:
            pairs.append((key, str(value)))
    return urlencode(pairs).encode()


class PaymentsConnector(Connector):
    name = "payments"
    honours_idempotency_key = True
    credential_strings = ("secret_key", "api_url")

    def execute(self, call: Call) -> dict[str, Any]:
        args = call.args
        amount = args.get("amount")
        if not isinstance(amount, int) or isinstance(amount, bool) or amount <= 0:
            raise ConnectorError("payments: 'amount' must be a positive integer (smallest unit)",
                                 retryable=False)
        if not isinstance(args.get("currency"), str):
            raise ConnectorError("payments: 'currency' is required", retryable=False)
        if not (args.get("source") or args.get("customer")):
            raise ConnectorError("payments: 'source' or 'customer' is required", retryable=False)
        secret = call.credentials.get("secret_key")
        if not secret:
            raise ConnectorError("payments: no secret_key in the tenant's payments credential",
                                 retryable=False)
        params = {key: args[key] for key in FIELDS if key in args}
        if args.get("metadata"):
            params["metadata"] = args["metadata"]
        tenant_url = call.credentials.get("api_url")
        base = (tenant_url or settings.STRIPE_API_URL).rstrip("/")
        response = transport.request(
            "POST", f"{base}/v1/charges", body=form_encode(params), receiver="payments",
            operator=not tenant_url,
            headers={"Authorization": f"Bearer {secret}", "Idempotency-Key": call.idempotency_key,
                     "Content-Type": "application/x-www-form-urlencoded"})
        answer = response.json()
        if response.status >= 400 or not isinstance(answer, dict) or "error" in answer:
            raise _error(response, answer if isinstance(answer, dict) else {})
        return {"id": answer["id"], "amount": answer["amount"], "currency": answer["currency"],
                "status": answer["status"], "paid": answer.get("paid", False),
                "replayed": response.headers.get("idempotent-replayed") == "true"}


def _error(response: transport.Response, answer: dict) -> ConnectorError:
    error = answer.get("error") or {}
    kind, code = error.get("type", "api_error"), error.get("code") or error.get("decline_code")
    text = f"payments: HTTP {response.status} {kind}" + (f" ({code})" if code else "")
    if error.get("message"):
        text += f": {error['message']}"
    should_retry = response.headers.get("stripe-should-retry")
    if should_retry in ("true", "false"):  # Stripe says so explicitly
        retryable = should_retry == "true"
    else:
        retryable = response.status in (409, 429) or response.status >= 500
    if kind == "card_error":
        retryable = False
    # 409/429 and validation errors were refused before anything happened; a 5xx may have acted.
    sent = response.status >= 500 or kind == "card_error"
    return ConnectorError(text + response.retry_after(), retryable=retryable, sent=sent)


connector_register(PaymentsConnector())
