"""Model calls, in the wire format the tenant's credential names (`api_format`):

- "openai" (the default): an OpenAI-compatible `POST {base_url}/chat/completions`;
- "anthropic": Anthropic's Messages API, `POST {base_url}/v1/messages` (anthropic_messages.py
  translates the conversation there and the answer back).

args (Chat Completions shape, whatever the provider): model, messages, and optionally
max_tokens, temperature, top_p, stop, seed, tools, tool_choice, response_format.
credentials: api_key, optionally base_url (else OPENAI_BASE_URL or ANTHROPIC_BASE_URL) and
api_format.
result: {"id", "model", "content", "finish_reason", "tool_calls" (only when the model called
tools, Chat Completions shape with JSON-string arguments), "usage": {"prompt_tokens",
"completion_tokens", "total_tokens"}, "cost_usd"}.

The key is sent as Idempotency-Key, but providers promise nothing about it, so the connector
declares that it does not honour keys: the ledger records the answer, and a recorded call is
never made again. A call whose answer was lost is safe to repeat (`safe_to_repeat`): it is made
again, and never put to a person.
"""

import hashlib
import json
from decimal import Decimal
from typing import Any

from django.conf import settings

from . import anthropic_messages, transport
from .base import Call, Connector, ConnectorError, connector_register

OPTIONAL = ("max_tokens", "max_completion_tokens", "temperature", "top_p", "stop", "seed", "tools",
            "tool_choice", "response_format", "user")
RETRYABLE_STATUS = {408, 409, 429}
API_FORMATS = ("openai", "anthropic")
# The most tokens one answer is counted as: usage is the provider's word, and a run's
# tokens_used is a bigint, so a count is kept between 0 (a negative one would give budget back)
# and this (past it the ledger's write would fail after the turn was paid for).
MAX_TOKENS_COUNTED = 10 ** 12


def _usage(prompt: int, completion: int, total: int | None = None) -> dict[str, int]:
    prompt, completion = (min(max(count, 0), MAX_TOKENS_COUNTED) for count in (prompt, completion))
    total = prompt + completion if total is None else min(max(total, prompt + completion),
                                                          2 * MAX_TOKENS_COUNTED)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": total}


def cost_usd(model: str, prompt_tokens: int, completion_tokens: int) -> float:
    """USD for the tokens, from MODEL_PRICES (per 1,000 tokens) or MODEL_PRICE_DEFAULT."""
    price_in, price_out = settings.MODEL_PRICES.get(model, settings.MODEL_PRICE_DEFAULT)
    cost = (Decimal(str(price_in)) * prompt_tokens + Decimal(str(price_out)) * completion_tokens) / 1000
    return float(round(cost, 8))


class ModelConnector(Connector):
    name = "model"
    honours_idempotency_key = False
    credential_strings = ("api_key", "base_url", "api_format")
    safe_to_repeat = True  # a second answer costs tokens, not a second act in the world

    def credential_problem(self, secrets: dict[str, Any]) -> str:
        problem = super().credential_problem(secrets)
        if not problem and secrets.get("api_format", "openai") not in API_FORMATS:
            problem = f"'api_format' must be one of {', '.join(map(repr, API_FORMATS))}"
        return problem

    def args_recorded(self, args: dict[str, Any]) -> dict[str, Any]:
        """The conversation is sent whole on every turn, and a run keeps it already (an agent's
        log): storing it with each turn's effect would grow as the square of the run's length.
        The ledger keeps its size and digest (the effect's args digest covers the whole)."""
        summary = dict(args)
        for name in ("messages", "tools"):
            if isinstance(args.get(name), list):
                text = json.dumps(args[name], sort_keys=True, default=str)
                summary[name] = {"count": len(args[name]),
                                 "sha256": hashlib.sha256(text.encode()).hexdigest()}
        return summary

    def execute(self, call: Call) -> dict[str, Any]:
        args = call.args
        if not isinstance(args.get("model"), str) or not args["model"]:
            raise ConnectorError("model: 'model' is required", retryable=False)
        if not isinstance(args.get("messages"), list) or not args["messages"]:
            raise ConnectorError("model: 'messages' must be a non-empty list", retryable=False)
        api_key = call.credentials.get("api_key")
        if not api_key:
            raise ConnectorError("model: no api_key in the tenant's model credential", retryable=False)
        problem = self.credential_problem(call.credentials)  # one stored before the check
        if problem:
            raise ConnectorError(f"model: the tenant's model credential is invalid: {problem}",
                                 retryable=False)
        if call.credentials.get("api_format") == "anthropic":
            return self._anthropic(call, api_key)
        body = {"model": args["model"], "messages": args["messages"],
                **{key: args[key] for key in OPTIONAL if key in args}}
        tenant_url = call.credentials.get("base_url")
        base = (tenant_url or settings.OPENAI_BASE_URL).rstrip("/")
        response = transport.request(
            "POST", f"{base}/chat/completions", body=json.dumps(body).encode(), receiver="model",
            operator=not tenant_url,
            headers={"Authorization": f"Bearer {api_key}", "Content-Type": "application/json",
                     "Idempotency-Key": call.idempotency_key})
        answer = _answer(response)
        try:
            choice = answer["choices"][0]
            usage = answer.get("usage") or {}
            counts = _usage(int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0)),
                            int(usage.get("total_tokens") or 0) or None)
        except (KeyError, IndexError, TypeError, ValueError, OverflowError):
            raise ConnectorError("model: the provider's answer has no choices", retryable=False,
                                 sent=True) from None
        message = choice.get("message") or {}
        result = {
            "id": answer.get("id"),
            "model": answer.get("model", args["model"]),
            "content": message.get("content"),
            "finish_reason": choice.get("finish_reason"),
            "usage": counts,
            "cost_usd": cost_usd(args["model"], counts["prompt_tokens"], counts["completion_tokens"]),
        }
        if message.get("tool_calls"):
            result["tool_calls"] = message["tool_calls"]
        return result

    def _anthropic(self, call: Call, api_key: str) -> dict[str, Any]:
        """One Messages API call: the conversation translated there, the answer back."""
        args = call.args
        body = anthropic_messages.request_body(args, max_tokens_default=settings.ANTHROPIC_MAX_TOKENS_DEFAULT)
        tenant_url = call.credentials.get("base_url")
        base = (tenant_url or settings.ANTHROPIC_BASE_URL).rstrip("/")
        response = transport.request(
            "POST", f"{base}/v1/messages", body=json.dumps(body).encode(), receiver="model",
            operator=not tenant_url,
            headers={"x-api-key": api_key, "anthropic-version": anthropic_messages.VERSION,
                     "Content-Type": "application/json", "Idempotency-Key": call.idempotency_key})
        answer = _answer(response)  # 529 is Anthropic's "overloaded": a 5xx, tried again
        result = anthropic_messages.answer_result(answer, model=args["model"])
        counted = result["usage"]
        usage = result["usage"] = _usage(counted["prompt_tokens"], counted["completion_tokens"])
        result["cost_usd"] = cost_usd(args["model"], usage["prompt_tokens"], usage["completion_tokens"])
        return result


def _answer(response: transport.Response) -> dict[str, Any]:
    """The provider's answer as a JSON object, or the ConnectorError that says why not: an HTTP
    error with the provider's own message (both formats put it at error.message), or an answer
    that is not JSON at all (a proxy's HTML page, a server that is not a model provider)."""
    answer = response.json()
    start = (response.body or b"")[:200].decode("utf-8", "replace")
    if response.status >= 400:
        error = answer.get("error") if isinstance(answer, dict) else None
        detail = error.get("message") if isinstance(error, dict) else None
        if not detail and not isinstance(answer, dict) and start.strip():
            # not a provider's error: a web page, another server (a 404 here: is base_url right?)
            detail = f"the answer is not a provider's JSON error: {start!r}"
        raise ConnectorError(
            f"model: HTTP {response.status}" + (f": {detail}" if detail else "")
            + response.retry_after(),
            retryable=response.status in RETRYABLE_STATUS or response.status >= 500,
            sent=response.status >= 500)
    if not isinstance(answer, dict):
        raise ConnectorError(
            f"model: HTTP {response.status}, but the answer is not a JSON object (without NaN or "
            f"Infinity), so this is not a model provider's answer (is base_url right?): {start!r}",
            retryable=False, sent=True)
    return answer


connector_register(ModelConnector())
