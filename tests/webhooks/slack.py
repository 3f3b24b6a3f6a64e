"""Signing Slack requests as Slack does, for the webhook tests and the benchmark."""

import json
import time
import uuid
from urllib.parse import urlencode

from integrations.webhooks.services import slack_signature


def signed_headers(secret: str, body: bytes, *, timestamp: float | None = None, **extra) -> dict:
    ts = str(int(time.time() if timestamp is None else timestamp))
    return {"HTTP_X_SLACK_REQUEST_TIMESTAMP": ts,
            "HTTP_X_SLACK_SIGNATURE": slack_signature(secret=secret, timestamp=ts, body=body),
            **extra}


def event_body(team_id: str, event: dict, event_id: str | None = None) -> bytes:
    return json.dumps({"token": "unused", "team_id": team_id, "api_app_id": "A1",
                       "type": "event_callback", "event_id": event_id or f"Ev{uuid.uuid4().hex}",
                       "event_time": int(time.time()), "event": event}).encode()


def click_body(team_id: str, approval_id: str, action: str = "approve",
               user: str = "U0MARIA") -> bytes:
    payload = {"type": "block_actions", "team": {"id": team_id}, "user": {"id": user},
               "response_url": "https://hooks.slack.com/actions/T/1/x", "trigger_id": "1.2.3",
               "actions": [{"type": "button", "action_id": action, "value": approval_id,
                            "block_id": f"approval:{approval_id}", "action_ts": str(time.time())}]}
    return urlencode({"payload": json.dumps(payload)}).encode()
