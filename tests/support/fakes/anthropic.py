"""A fake Anthropic Messages API: `POST /v1/messages`, checked the way Anthropic checks it.

Requests need `x-api-key` (starting "sk-ant-"), `anthropic-version: 2023-06-01`, a `model`,
`max_tokens` and `messages` that alternate user/assistant starting with a user (no "system"
role: the system prompt is the top-level `system`), no empty text blocks, each user message's
`tool_result` blocks first and each naming a `tool_use` of the assistant message before it, and
tools with an `input_schema`; anything else is a 400 `invalid_request_error`, as Anthropic
answers.

The answer is deterministic. With a `script` (a list of turns, played by the number of assistant
messages already in the conversation, like integrations/scripted_model.py): a turn is
{"text": "..."} or {"tool_use": {"name": ..., "input": {...}}}. Past the script's end, or with
none: "echo: " and the last user text (or "tool said: " and the last tool result), cut to
max_tokens words (stop_reason "max_tokens"). Tokens: whitespace-separated words; input_tokens
counts the system prompt's and every text's words plus 3 per message. Knobs: `script`,
`ratelimited_next` (429 rate_limit_error, retry-after 1), `overloaded_next` (529
overloaded_error), `delay`. `last_request` holds the last body received.
"""

import json
import secrets
import time
from typing import Any

from . import FakeServer

VERSION = "2023-06-01"


class FakeAnthropic(FakeServer):
    name = "anthropic"
    configurable = ("script", "ratelimited_next", "overloaded_next", "delay")

    def reset(self) -> None:
        with self.lock:
            self.requests = 0
            self.script: list[dict] = []
            self.ratelimited_next = self.overloaded_next = 0
            self.delay = 0.0
            self.last_request: dict | None = None
            self.input_tokens = self.output_tokens = 0

    def state(self) -> dict[str, Any]:
        with self.lock:
            return {"requests": self.requests, "input_tokens": self.input_tokens,
                    "output_tokens": self.output_tokens}

    def handle(self, method, path, query, headers, raw):
        if (method, path) != ("POST", "/v1/messages"):
            return _error(404, "not_found_error", f"Not found: {method} {path}")
        if not (headers.get("x-api-key") or "").startswith("sk-ant-"):
            return _error(401, "authentication_error", "invalid x-api-key")
        if headers.get("anthropic-version") != VERSION:
            return _error(400, "invalid_request_error", "anthropic-version: header is required")
        with self.lock:
            if self.ratelimited_next > 0:
                self.ratelimited_next -= 1
                status, body, _ = _error(429, "rate_limit_error", "Number of request tokens has "
                                         "exceeded your per-minute rate limit")
                return status, body, {"retry-after": "1"}
            if self.overloaded_next > 0:
                self.overloaded_next -= 1
                return _error(529, "overloaded_error", "Overloaded")
        try:
            request = json.loads(raw)
        except ValueError:
            return _error(400, "invalid_request_error", "The request body is not valid JSON.")
        problem = _problem(request)
        if problem:
            return _error(400, "invalid_request_error", problem)
        messages = request["messages"]
        turn = sum(message["role"] == "assistant" for message in messages)
        with self.lock:
            self.last_request = request
            script = list(self.script)
            delay = self.delay
        if turn < len(script) and "tool_use" in script[turn]:
            use = script[turn]["tool_use"]
            content = [{"type": "tool_use", "id": f"toolu_{secrets.token_hex(12)}",
                        "name": use["name"], "input": use.get("input", {})}]
            if script[turn].get("text"):
                content.insert(0, {"type": "text", "text": script[turn]["text"]})
            words, stop = len(json.dumps(use.get("input", {})).split()) + 1, "tool_use"
        else:
            text = script[turn]["text"] if turn < len(script) else _echo(messages[-1])
            all_words = text.split()
            limit = request["max_tokens"]
            stop = "max_tokens" if len(all_words) > limit else "end_turn"
            words = min(len(all_words), limit)
            content = [{"type": "text", "text": " ".join(all_words[:limit])}]
        prompt = _words(request.get("system")) + sum(_words(m["content"]) + 3 for m in messages)
        with self.lock:
            self.requests += 1
            self.input_tokens += prompt
            self.output_tokens += words
        if delay:
            time.sleep(delay)
        return 200, {
            "id": f"msg_{secrets.token_hex(12)}", "type": "message", "role": "assistant",
            "model": request["model"], "content": content, "stop_reason": stop,
            "stop_sequence": None,
            "usage": {"input_tokens": prompt, "output_tokens": words,
                      "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0},
        }, {"request-id": f"req_{secrets.token_hex(8)}"}


def _problem(request: Any) -> str:
    """What Anthropic would refuse in this request ("" if nothing)."""
    if not isinstance(request, dict) or not isinstance(request.get("model"), str):
        return "model: Field required"
    if not isinstance(request.get("max_tokens"), int) or request["max_tokens"] < 1:
        return "max_tokens: Field required"
    messages = request.get("messages")
    if not isinstance(messages, list) or not messages:
        return "messages: at least one message is required"
    if "system" in request and not isinstance(request["system"], str | list):
        return "system: Input should be a valid string"
    previous_uses: set[str] = set()
    for index, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ("user", "assistant"):
            return f"messages.{index}.role: Input should be 'user' or 'assistant'"
        if (index == 0 and role != "user") or (index and role == messages[index - 1]["role"]):
            return "messages: roles must alternate between \"user\" and \"assistant\""
        content = message.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if not isinstance(blocks, list) or not blocks:
            return f"messages.{index}: content must not be empty"
        results_done, uses = False, set()
        for number, block in enumerate(blocks):
            kind = block.get("type") if isinstance(block, dict) else None
            where = f"messages.{index}.content.{number}"
            if kind == "text":
                if not block.get("text"):
                    return f"{where}: text content blocks must be non-empty"
                results_done = True
            elif kind == "tool_use" and role == "assistant":
                if not block.get("id") or not block.get("name") or not isinstance(block.get("input"), dict):
                    return f"{where}: tool_use needs id, name and an input object"
                uses.add(block["id"])
            elif kind == "tool_result" and role == "user":
                if results_done:
                    return (f"{where}: tool_result blocks must come first in the user message")
                if block.get("tool_use_id") not in previous_uses:
                    return (f"{where}: unexpected `tool_use_id` found in `tool_result` blocks: "
                            f"{block.get('tool_use_id')}. Each `tool_result` block must have a "
                            "corresponding `tool_use` block in the previous message.")
            else:
                return f"{where}: unexpected block type {kind!r} for role {role!r}"
        previous_uses = uses
    for number, tool in enumerate(request.get("tools") or []):
        if not isinstance(tool, dict) or not tool.get("name") or \
                not isinstance(tool.get("input_schema"), dict):
            return f"tools.{number}: name and input_schema are required"
    return ""


def _echo(message: dict) -> str:
    content = message["content"]
    if isinstance(content, str):
        return f"echo: {content}"
    results = [block for block in content if block["type"] == "tool_result"]
    if results:
        text = results[-1].get("content")
        return f"tool said: {text if isinstance(text, str) else json.dumps(text)}"
    return "echo: " + " ".join(block["text"] for block in content if block["type"] == "text")


def _words(content: Any) -> int:
    if content is None:
        return 0
    if isinstance(content, str):
        return len(content.split())
    return sum(len(str(block.get("text") or block.get("content") or "").split()) for block in content)


def _error(status: int, kind: str, message: str):
    return status, {"type": "error", "error": {"type": kind, "message": message},
                    "request_id": f"req_{secrets.token_hex(8)}"}, {}


if __name__ == "__main__":
    FakeAnthropic.main()
