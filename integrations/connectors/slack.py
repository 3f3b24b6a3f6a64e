"""Slack `chat.postMessage`, with the idempotency key in the message's metadata.

args: channel (an ID such as C0123; lookups need the ID), text, and optionally blocks, thread_ts.
credentials: token (a bot token, xoxb-...), optionally api_url (else SLACK_API_URL).
result: {"channel": "C0123", "ts": "1712345678.000100"}.

Slack ignores idempotency keys, so `lookup` searches the conversation (conversations.history, or
conversations.replies for a thread) for a message whose metadata carries the key.
"""

import json
import time
from typing import Any
from urllib.parse import urlencode

from django.conf import settings

from . import transport
from .base import Call, Connector, ConnectorError, Found, Lookup, connector_register

EVENT_TYPE = "agentplatform_effect"
# Errors that a later attempt may not meet; anything else is a request Slack will refuse again.
RETRYABLE_ERRORS = {"ratelimited", "service_unavailable", "internal_error", "fatal_error",
                    "request_timeout"}
PAGE_SIZE = 200


class SlackConnector(Connector):
    name = "slack"
    honours_idempotency_key = False
    credential_strings = ("token", "api_url")

    def execute(self, call: Call) -> dict[str, Any]:
        args = call.args
        if not isinstance(args.get("channel"), str) or not args["channel"]:
            raise ConnectorError("slack: 'channel' is required", retryable=False)
        if not isinstance(args.get("text"), str) and not args.get("blocks"):
            raise ConnectorError("slack: 'text' (or 'blocks') is required", retryable=False)
        payload = {key: args[key] for key in ("channel", "text", "blocks", "thread_ts") if key in args}
        payload["metadata"] = {"event_type": EVENT_TYPE,
                               "event_payload": {"idempotency_key": call.idempotency_key}}
        answer = self._call(call, "chat.postMessage", method="POST",
                            body=json.dumps(payload).encode())
        return {"channel": answer["channel"], "ts": answer["ts"]}

    def lookup(self, call: Call) -> Found | Lookup:
        channel, thread = call.args.get("channel"), call.args.get("thread_ts")
        params: dict[str, Any] = {"channel": channel, "include_all_metadata": "true", "limit": PAGE_SIZE,
                                  "oldest": f"{time.time() - settings.SLACK_LOOKUP_WINDOW_SECONDS:.6f}"}
        if thread:
            params["ts"] = thread
        method = "conversations.replies" if thread else "conversations.history"
        for _ in range(settings.SLACK_LOOKUP_MAX_PAGES):
            try:
                answer = self._call(call, f"{method}?{urlencode(params)}", method="GET")
            except ConnectorError:
                return Lookup.UNKNOWN
            for message in answer.get("messages") or []:
                metadata = message.get("metadata") or {}
                if (metadata.get("event_type") == EVENT_TYPE and
                        (metadata.get("event_payload") or {}).get("idempotency_key")
                        == call.idempotency_key):
                    return Found({"channel": answer.get("channel") or channel, "ts": message["ts"]})
            cursor = (answer.get("response_metadata") or {}).get("next_cursor")
            if not answer.get("has_more") or not cursor:
                return Lookup.NOT_FOUND  # the whole window was searched
            params["cursor"] = cursor
        return Lookup.UNKNOWN  # more history than we are willing to page through

    def _call(self, call: Call, method_and_query: str, *, method: str, body: bytes | None = None) -> dict:
        token = call.credentials.get("token")
        if not token:
            raise ConnectorError("slack: no bot token in the tenant's slack credential", retryable=False)
        tenant_url = call.credentials.get("api_url")
        base = (tenant_url or settings.SLACK_API_URL).rstrip("/")
        headers = {"Authorization": f"Bearer {token}"}
        if body is not None:
            headers["Content-Type"] = "application/json; charset=utf-8"
        response = transport.request(method, f"{base}/{method_and_query}", headers=headers, body=body,
                                     receiver="slack",
                                     operator=not tenant_url)
        answer = response.json()
        if response.status == 429 or (isinstance(answer, dict) and answer.get("error") == "ratelimited"):
            raise ConnectorError(f"slack: ratelimited{response.retry_after()}", retryable=True)
        if response.status >= 500:
            raise ConnectorError(f"slack: HTTP {response.status}; the message may have been posted",
                                 retryable=True, sent=True)
        if not isinstance(answer, dict):
            raise ConnectorError(f"slack: HTTP {response.status} without a JSON answer",
                                 retryable=response.status >= 500, sent=True)
        if not answer.get("ok"):
            error = str(answer.get("error") or "unknown_error")
            raise ConnectorError(f"slack: {error}", retryable=error in RETRYABLE_ERRORS,
                                 sent=error in RETRYABLE_ERRORS - {"ratelimited"})
        return answer


connector_register(SlackConnector())
