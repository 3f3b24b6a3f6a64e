"""Anthropic's Messages API wire format (`POST /v1/messages`, `anthropic-version: 2023-06-01`),
translated to and from the Chat Completions shape the rest of the platform speaks.

Going there: system messages become the top-level `system`; an assistant's `tool_calls` become
`tool_use` blocks (arguments parsed into `input`); a `tool` message becomes a `user` message with
a `tool_result` block; consecutive messages of one role are merged into one (Anthropic requires
the roles to alternate, and a turn's tool results to be one user message, results first); tools
become `{name, description, input_schema}`. Coming back: text blocks joined as `content`,
`tool_use` blocks as Chat Completions `tool_calls` with JSON-string arguments, `stop_reason`
mapped to `finish_reason`, `input_tokens`/`output_tokens` to the usage counts.
Pure translation: the HTTP is the model connector's.
"""

import json
from typing import Any

from .base import ConnectorError

VERSION = "2023-06-01"
FINISH_REASONS = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length",
                  "tool_use": "tool_calls", "refusal": "content_filter"}
TOOL_CHOICES = {"auto": {"type": "auto"}, "none": {"type": "none"}, "required": {"type": "any"}}
EMPTY_SCHEMA = {"type": "object", "properties": {}}


def request_body(args: dict[str, Any], *, max_tokens_default: int) -> dict[str, Any]:
    """The Messages API request for Chat Completions `args`; ConnectorError (not retryable,
    nothing sent) for what Anthropic cannot be asked."""
    system, messages = [], []
    for index, message in enumerate(args["messages"]):
        if not isinstance(message, dict):
            raise _refused(f"messages[{index}] is not an object")
        role = message.get("role")
        if role in ("system", "developer"):
            text = _text(message.get("content"), where=f"messages[{index}]")
            if text:
                system.append(text)
        elif role == "user":
            _append(messages, "user", _user_blocks(message.get("content"), where=f"messages[{index}]"))
        elif role == "assistant":
            _append(messages, "assistant", _assistant_blocks(message, where=f"messages[{index}]"))
        elif role == "tool":
            _append(messages, "user", [_tool_result(message, where=f"messages[{index}]")])
        else:
            raise _refused(f"messages[{index}] has role {role!r}, which Anthropic has no place for")
    if not messages:
        raise _refused("the conversation has no user or assistant message")
    for message in messages:  # a turn's tool results come first in its user message
        if message["role"] == "user":
            message["content"].sort(key=lambda block: block["type"] != "tool_result")
    max_tokens = args.get("max_tokens") or args.get("max_completion_tokens") or max_tokens_default
    body: dict[str, Any] = {"model": args["model"], "max_tokens": max_tokens, "messages": messages}
    if system:
        body["system"] = "\n\n".join(system)
    for key in ("temperature", "top_p"):
        if args.get(key) is not None:
            body[key] = args[key]
    if args.get("stop"):
        body["stop_sequences"] = [args["stop"]] if isinstance(args["stop"], str) else list(args["stop"])
    if args.get("user"):
        body["metadata"] = {"user_id": str(args["user"])}
    if args.get("tools"):
        body["tools"] = [_tool(tool, where=f"tools[{index}]") for index, tool in enumerate(args["tools"])]
    if args.get("tool_choice") is not None:
        body["tool_choice"] = _tool_choice(args["tool_choice"])
    if args.get("response_format") not in (None, {"type": "text"}):
        raise _refused("response_format is not part of Anthropic's Messages API")
    return body  # `seed` has no counterpart and is left out: nothing promised it


def answer_result(answer: dict[str, Any], *, model: str) -> dict[str, Any]:
    """The model connector's result for a Messages API answer (without cost_usd)."""
    try:
        blocks = answer["content"]
        usage = answer.get("usage") or {}
        prompt = int(usage.get("input_tokens", 0)) + int(usage.get("cache_creation_input_tokens") or 0) \
            + int(usage.get("cache_read_input_tokens") or 0)
        completion = int(usage.get("output_tokens", 0))
        assert isinstance(blocks, list)
    except (KeyError, TypeError, ValueError, OverflowError, AssertionError):
        raise ConnectorError("model: the provider's answer has no content", retryable=False,
                             sent=True) from None
    texts = [block.get("text") or "" for block in blocks
             if isinstance(block, dict) and block.get("type") == "text"]
    calls = [{"id": str(block.get("id") or ""), "type": "function",
              "function": {"name": str(block.get("name") or ""),
                           "arguments": json.dumps(block.get("input") or {}, ensure_ascii=False)}}
             for block in blocks if isinstance(block, dict) and block.get("type") == "tool_use"]
    stop = answer.get("stop_reason")
    result = {
        "id": answer.get("id"),
        "model": answer.get("model", model),
        "content": "".join(texts) if texts else None,
        "finish_reason": FINISH_REASONS.get(stop, stop),
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                  "total_tokens": prompt + completion},
    }
    if calls:
        result["tool_calls"] = calls
    return result


def _append(messages: list[dict], role: str, blocks: list[dict]) -> None:
    """Add a message's blocks, merged into the previous message when it has the same role."""
    if not blocks:  # an empty turn (no text, no calls): Anthropic refuses empty content
        return
    if messages and messages[-1]["role"] == role:
        messages[-1]["content"].extend(blocks)
    else:
        messages.append({"role": role, "content": list(blocks)})


def _text(content: Any, *, where: str) -> str:
    """A Chat Completions content (a string, or text parts) as one string."""
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                raise _refused(f"{where}: only text content can be sent to Anthropic here")
            parts.append(str(part.get("text") or ""))
        return "".join(parts)
    raise _refused(f"{where}: content must be a string or a list of text parts")


def _user_blocks(content: Any, *, where: str) -> list[dict]:
    text = _text(content, where=where)
    return [{"type": "text", "text": text}] if text else []


def _assistant_blocks(message: dict, *, where: str) -> list[dict]:
    text = _text(message.get("content"), where=where)
    blocks = [{"type": "text", "text": text}] if text else []
    for number, tool_call in enumerate(message.get("tool_calls") or []):
        function = tool_call.get("function") if isinstance(tool_call, dict) else None
        if not isinstance(function, dict) or not tool_call.get("id") or not function.get("name"):
            raise _refused(f"{where}.tool_calls[{number}] needs an id and a function name")
        raw = function.get("arguments") or "{}"
        try:
            arguments = json.loads(raw) if isinstance(raw, str) else raw
        except ValueError:
            arguments = None
        # `input` must be an object: unreadable arguments (the runner told the model so in the
        # tool's result) are kept as text rather than refused
        if not isinstance(arguments, dict):
            arguments = {"unreadable_arguments": raw if isinstance(raw, str) else json.dumps(raw)}
        blocks.append({"type": "tool_use", "id": str(tool_call["id"]), "name": str(function["name"]),
                       "input": arguments})
    return blocks


def _tool_result(message: dict, *, where: str) -> dict:
    if not message.get("tool_call_id"):
        raise _refused(f"{where}: a tool message needs its tool_call_id")
    return {"type": "tool_result", "tool_use_id": str(message["tool_call_id"]),
            "content": _text(message.get("content"), where=where)}


def _tool(tool: Any, *, where: str) -> dict:
    function = tool.get("function") if isinstance(tool, dict) else None
    if not isinstance(function, dict) or not function.get("name"):
        raise _refused(f"{where} is not a function tool with a name")
    converted = {"name": function["name"], "input_schema": function.get("parameters") or EMPTY_SCHEMA}
    if function.get("description"):
        converted["description"] = function["description"]
    return converted


def _tool_choice(choice: Any) -> dict:
    if isinstance(choice, str) and choice in TOOL_CHOICES:
        return TOOL_CHOICES[choice]
    if isinstance(choice, dict) and isinstance(choice.get("function"), dict) \
            and choice["function"].get("name"):
        return {"type": "tool", "name": choice["function"]["name"]}
    raise _refused("tool_choice must be 'auto', 'none', 'required' or a function by name")


def _refused(why: str) -> ConnectorError:
    return ConnectorError(f"model: cannot be sent to Anthropic: {why}", retryable=False, sent=False)
