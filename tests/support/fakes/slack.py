"""A fake Slack Web API: chat.postMessage, conversations.history and conversations.replies.

Answers as Slack does: HTTP 200 with {"ok": true, ...} or {"ok": false, "error": "..."}; HTTP 429
with Retry-After and "ratelimited" when asked to (`ratelimited_next`). Tokens must look like bot
or user tokens (xoxb-/xoxp-), else invalid_auth. Message metadata is stored and returned by the
history methods when include_all_metadata is true. History is newest first and cursor-paginated.
"""

import base64
import hashlib
import json
import time
from typing import Any
from urllib.parse import parse_qsl

from . import DROP, FakeServer, bearer


class FakeSlack(FakeServer):
    name = "slack"
    configurable = ("ratelimited_next", "retry_after", "drop_next")

    def reset(self) -> None:
        with self.lock:
            self.messages: dict[str, list[dict[str, Any]]] = {}  # channel id -> oldest first
            self.posts = self.history_requests = 0
            self.ratelimited_next, self.retry_after, self.drop_next = 0, 1, 0
            self._clock = 0

    def state(self) -> dict[str, Any]:
        with self.lock:
            return {"posts": self.posts, "history_requests": self.history_requests,
                    "messages": {channel: len(items) for channel, items in self.messages.items()},
                    "posts_by_key": self.posts_by_key()}

    def posts_by_key(self) -> dict[str, int]:
        with self.lock:
            counts: dict[str, int] = {}
            for items in self.messages.values():
                for message in items:
                    key = ((message.get("metadata") or {}).get("event_payload") or {}).get("idempotency_key")
                    if key:
                        counts[key] = counts.get(key, 0) + 1
            return counts

    def handle(self, method, path, query, headers, raw):
        if not path.startswith("/api/"):
            return 404, {"ok": False, "error": "unknown_method"}, {}
        api_method = path[len("/api/"):]
        params = dict(query)
        if raw:
            if (headers.get("Content-Type") or "").startswith("application/json"):
                params.update(json.loads(raw))
            else:
                params.update(parse_qsl(raw.decode(), keep_blank_values=True))
        token = bearer(headers) or params.pop("token", "")
        with self.lock:
            if self.ratelimited_next > 0:
                self.ratelimited_next -= 1
                return 429, {"ok": False, "error": "ratelimited"}, {"Retry-After": str(self.retry_after)}
        if not token.startswith(("xoxb-", "xoxp-")):
            return 200, {"ok": False, "error": "invalid_auth"}, {}
        handler = {"chat.postMessage": self.post_message,
                   "conversations.history": self.history,
                   "conversations.replies": self.replies}.get(api_method)
        if handler is None:
            return 200, {"ok": False, "error": "unknown_method"}, {}
        return handler(params)

    def post_message(self, params):
        channel = params.get("channel")
        if not channel:
            return 200, {"ok": False, "error": "channel_not_found"}, {}
        if not params.get("text") and not params.get("blocks"):
            return 200, {"ok": False, "error": "no_text"}, {}
        metadata = params.get("metadata")
        if isinstance(metadata, str):  # form-encoded requests send it as a JSON string
            metadata = json.loads(metadata)
        channel_id = _channel_id(channel)
        with self.lock:
            self.posts += 1
            self._clock += 1
            ts = f"{int(time.time())}.{self._clock:06d}"
            message = {"type": "message", "subtype": "bot_message", "bot_id": "B0FAKE", "text":
                       params.get("text", ""), "ts": ts}
            if params.get("thread_ts"):
                message["thread_ts"] = params["thread_ts"]
            if params.get("blocks"):  # history returns a message's blocks, as Slack does
                blocks = params["blocks"]
                message["blocks"] = json.loads(blocks) if isinstance(blocks, str) else blocks
            if metadata:
                message["metadata"] = metadata
            self.messages.setdefault(channel_id, []).append(message)
            drop = self.drop_next > 0
            self.drop_next -= 1 if drop else 0
        if drop:
            return DROP, None, {}
        return 200, {"ok": True, "channel": channel_id, "ts": ts, "message": message}, {}

    def history(self, params):
        with self.lock:
            self.history_requests += 1
            items = self.messages.get(params.get("channel", ""))
            if items is None:
                return 200, {"ok": False, "error": "channel_not_found"}, {}
            # Thread replies stay in their thread; history shows the conversation's top level.
            found = [m for m in reversed(items) if m.get("thread_ts", m["ts"]) == m["ts"]]
        return self._page(_in_window(found, params), params, {"pin_count": 0})

    def replies(self, params):
        with self.lock:
            self.history_requests += 1
            items = self.messages.get(params.get("channel", ""))
            if items is None:
                return 200, {"ok": False, "error": "channel_not_found"}, {}
            thread = params.get("ts")
            found = [m for m in items if m["ts"] == thread or m.get("thread_ts") == thread]
        if not found:
            return 200, {"ok": False, "error": "thread_not_found"}, {}
        return self._page(_in_window(found, params), params, {})

    def _page(self, found, params, extra):
        limit = min(max(int(params.get("limit") or 100), 1), 999)
        offset = int(base64.b64decode(params["cursor"]).decode().split(":")[1]) if params.get("cursor") else 0
        page = found[offset:offset + limit]
        with_metadata = str(params.get("include_all_metadata", "")).lower() in ("true", "1")
        page = [m if with_metadata else {k: v for k, v in m.items() if k != "metadata"} for m in page]
        more = offset + limit < len(found)
        body = {"ok": True, "messages": page, "has_more": more, **extra,
                "response_metadata": {"next_cursor": base64.b64encode(
                    f"offset:{offset + limit}".encode()).decode() if more else ""}}
        return 200, body, {}


def _channel_id(channel: str) -> str:
    if channel.startswith("#"):
        return "C" + hashlib.sha256(channel.encode()).hexdigest()[:10].upper()
    return channel


def _in_window(messages, params):
    inclusive = str(params.get("inclusive", "")).lower() in ("true", "1")
    oldest, latest = float(params.get("oldest") or 0), float(params.get("latest") or "inf")

    def inside(ts: float) -> bool:
        return (oldest <= ts <= latest) if inclusive else (oldest < ts < latest)

    return [m for m in messages if inside(float(m["ts"]))]


if __name__ == "__main__":
    FakeSlack.main()
