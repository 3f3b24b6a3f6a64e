"""A fake OpenAI-compatible provider: `POST /v1/chat/completions`.

The answer is deterministic: "echo: " and the last user message, cut to max_tokens words
(finish_reason "length"). A token is a whitespace-separated word: prompt_tokens counts every
message's words plus 3 per message. Counts requests, per Idempotency-Key too. Knobs:
`ratelimited_next` (429s), `failing_next` (500s), `delay`, `drop_next`.
"""

import json
import secrets
import time
from typing import Any

from . import DROP, FakeServer, bearer


class FakeOpenAI(FakeServer):
    name = "openai"
    configurable = ("ratelimited_next", "failing_next", "delay", "drop_next")

    def reset(self) -> None:
        with self.lock:
            self.requests = 0
            self.by_key: dict[str, int] = {}
            self.prompt_tokens = self.completion_tokens = 0
            self.ratelimited_next = self.failing_next = self.drop_next = 0
            self.delay = 0.0

    def state(self) -> dict[str, Any]:
        with self.lock:
            return {"requests": self.requests, "requests_by_key": dict(self.by_key),
                    "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens}

    def handle(self, method, path, query, headers, raw):
        if (method, path) != ("POST", "/v1/chat/completions"):
            return _error(404, "invalid_request_error", f"Unknown request URL: {method} {path}.")
        if not bearer(headers).startswith("sk-"):
            return _error(401, "invalid_request_error", "Incorrect API key provided.", "invalid_api_key")
        with self.lock:
            if self.ratelimited_next > 0:
                self.ratelimited_next -= 1
                status, body, extra = _error(429, "requests", "Rate limit reached.", "rate_limit_exceeded")
                return status, body, {**extra, "Retry-After": "1"}
            if self.failing_next > 0:
                self.failing_next -= 1
                return _error(500, "server_error", "The server had an error processing your request.")
        try:
            request = json.loads(raw)
            model, messages = request["model"], request["messages"]
            assert isinstance(messages, list) and messages
        except (ValueError, KeyError, AssertionError):
            return _error(400, "invalid_request_error", "'model' and 'messages' are required.")
        if model.startswith("unknown"):
            return _error(404, "invalid_request_error", f"The model `{model}` does not exist.",
                          "model_not_found")
        last_user = next((m.get("content") or "" for m in reversed(messages) if m.get("role") == "user"), "")
        words = f"echo: {last_user}".split()
        limit = request.get("max_tokens") or request.get("max_completion_tokens")
        finish = "length" if limit and len(words) > limit else "stop"
        words = words[:limit] if limit else words
        prompt = sum(len(str(m.get("content") or "").split()) + 3 for m in messages)
        key = headers.get("Idempotency-Key") or ""
        with self.lock:
            self.requests += 1
            if key:
                self.by_key[key] = self.by_key.get(key, 0) + 1
            self.prompt_tokens += prompt
            self.completion_tokens += len(words)
            delay, drop = self.delay, self.drop_next > 0
            self.drop_next -= 1 if drop else 0
        if delay:
            time.sleep(delay)
        if drop:
            return DROP, None, {}
        return 200, {
            "id": f"chatcmpl-{secrets.token_hex(12)}", "object": "chat.completion",
            "created": int(time.time()), "model": model, "system_fingerprint": "fp_fake",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": " ".join(words),
                                                 "refusal": None},
                         "logprobs": None, "finish_reason": finish}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": len(words),
                      "total_tokens": prompt + len(words)},
        }, {}


def _error(status: int, kind: str, message: str, code: str | None = None):
    return status, {"error": {"message": message, "type": kind, "param": None, "code": code}}, {}


if __name__ == "__main__":
    FakeOpenAI.main()
