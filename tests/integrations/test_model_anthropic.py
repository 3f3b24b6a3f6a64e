"""The model connector with an `api_format: anthropic` credential, against a fake Anthropic
Messages API that checks requests the way Anthropic does: the conversation translated there
(system, tool_use, tool_result, merged roles), the answer normalised back to the Chat
Completions result every caller reads."""

import json

import pytest

from integrations.connectors import ConnectorError, connector_get
from integrations.services import CredentialError, credential_set
from runs.definitions.services import definition_create
from runs.effects.models import Effect
from runs.models import Run
from tests.support.runs import finished, start

API_KEY = "sk-ant-acme-secret"


@pytest.fixture
def model():
    return connector_get("model")


def creds(fake) -> dict:
    return {"api_key": API_KEY, "base_url": fake.url, "api_format": "anthropic"}


def ask(text: str, **extra) -> dict:
    return {"model": "claude-sonnet-4-5", "messages": [{"role": "system", "content": "be brief"},
                                                       {"role": "user", "content": text}], **extra}


def test_a_message_returns_content_usage_and_cost(model, fake_anthropic, call, settings):
    settings.MODEL_PRICES = {"claude-sonnet-4-5": (3.0, 15.0)}
    result = model.execute(call(ask("three word answer", max_tokens=100, temperature=0),
                                creds(fake_anthropic)))
    assert result["content"] == "echo: three word answer" and result["finish_reason"] == "stop"
    # "be brief" (2) + "three word answer" (3) + 3 for the one message
    assert result["usage"] == {"prompt_tokens": 8, "completion_tokens": 4, "total_tokens": 12}
    assert result["cost_usd"] == pytest.approx((8 * 3.0 + 4 * 15.0) / 1000)
    assert result["id"].startswith("msg_") and "tool_calls" not in result
    sent = fake_anthropic.last_request
    assert sent["system"] == "be brief" and sent["max_tokens"] == 100 and sent["temperature"] == 0
    assert sent["messages"] == [{"role": "user", "content": [{"type": "text", "text": "three word answer"}]}]


def test_max_tokens_is_sent_always_and_its_stop_reason_maps_to_length(model, fake_anthropic, call,
                                                                      settings):
    result = model.execute(call(ask("a b c d e f", max_tokens=3), creds(fake_anthropic)))
    assert result["content"] == "echo: a b" and result["finish_reason"] == "length"
    settings.ANTHROPIC_MAX_TOKENS_DEFAULT = 77
    model.execute(call({**ask("x"), "max_tokens": None}, creds(fake_anthropic)))
    assert fake_anthropic.last_request["max_tokens"] == 77  # Anthropic requires it


def test_tool_use_comes_back_as_chat_completions_tool_calls(model, fake_anthropic, call):
    fake_anthropic.script = [{"text": "Let me look.",
                              "tool_use": {"name": "search", "input": {"query": "ledger"}}}]
    tools = [{"type": "function", "function": {
        "name": "search", "description": "Search the docs",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}}}]
    result = model.execute(call(ask("find it", tools=tools, tool_choice="required"),
                                creds(fake_anthropic)))
    assert result["finish_reason"] == "tool_calls" and result["content"] == "Let me look."
    [tool_call] = result["tool_calls"]
    assert tool_call["type"] == "function" and tool_call["id"].startswith("toolu_")
    assert tool_call["function"]["name"] == "search"
    assert json.loads(tool_call["function"]["arguments"]) == {"query": "ledger"}
    sent = fake_anthropic.last_request
    assert sent["tools"] == [{"name": "search", "description": "Search the docs",
                              "input_schema": tools[0]["function"]["parameters"]}]
    assert sent["tool_choice"] == {"type": "any"}


def test_a_conversation_with_tool_results_is_translated_and_merged(model, fake_anthropic, call):
    """Two tool calls, their two results (two `tool` messages) and a user note after them: one
    assistant message of tool_use blocks, then one user message with both results first."""
    calls = [{"id": f"toolu_{n}", "type": "function",
              "function": {"name": "search", "arguments": json.dumps({"query": q})}}
             for n, q in enumerate(["a", "b"])]
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "look twice"},
        {"role": "user", "content": [{"type": "text", "text": "please"}]},
        {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "tool", "tool_call_id": "toolu_0", "name": "search", "content": "{\"hits\": 1}"},
        {"role": "tool", "tool_call_id": "toolu_1", "name": "search", "content": "{\"hits\": 2}"},
        {"role": "system", "content": "answer now"},
    ]
    result = model.execute(call({"model": "claude-sonnet-4-5", "messages": messages},
                                creds(fake_anthropic)))
    assert result["content"] == "tool said: {\"hits\": 2}"
    sent = fake_anthropic.last_request
    assert sent["system"] == "be brief\n\nanswer now"
    assert [m["role"] for m in sent["messages"]] == ["user", "assistant", "user"]
    assert sent["messages"][0]["content"] == [{"type": "text", "text": "look twice"},
                                              {"type": "text", "text": "please"}]
    assert sent["messages"][1]["content"] == [
        {"type": "tool_use", "id": "toolu_0", "name": "search", "input": {"query": "a"}},
        {"type": "tool_use", "id": "toolu_1", "name": "search", "input": {"query": "b"}}]
    assert sent["messages"][2]["content"] == [
        {"type": "tool_result", "tool_use_id": "toolu_0", "content": "{\"hits\": 1}"},
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "{\"hits\": 2}"}]


def test_provider_errors_map_to_retryable_or_not(model, fake_anthropic, call):
    fake_anthropic.ratelimited_next = 1
    with pytest.raises(ConnectorError, match=r"HTTP 429.*rate limit.*retry after 1s") as limited:
        model.execute(call(ask("x"), creds(fake_anthropic)))
    assert limited.value.retryable and not limited.value.sent
    fake_anthropic.overloaded_next = 1
    with pytest.raises(ConnectorError, match="HTTP 529: Overloaded") as overloaded:
        model.execute(call(ask("x"), creds(fake_anthropic)))
    assert overloaded.value.retryable and overloaded.value.sent
    with pytest.raises(ConnectorError, match="HTTP 401: invalid x-api-key") as unauthorized:
        model.execute(call(ask("x"), {**creds(fake_anthropic), "api_key": "sk-wrong"}))
    assert not unauthorized.value.retryable
    with pytest.raises(ConnectorError, match="cannot be sent to Anthropic.*role 'function'") as odd:
        model.execute(call({"model": "claude-sonnet-4-5",
                            "messages": [{"role": "function", "content": "x"}]},
                           creds(fake_anthropic)))
    assert not odd.value.retryable and not odd.value.sent
    assert fake_anthropic.state()["requests"] == 0


def test_the_operator_setting_is_the_base_url_when_the_credential_has_none(model, fake_anthropic,
                                                                          call, settings):
    settings.ANTHROPIC_BASE_URL = fake_anthropic.url
    result = model.execute(call(ask("hello"), {"api_key": API_KEY, "api_format": "anthropic"}))
    assert result["content"] == "echo: hello"


def test_an_unknown_api_format_is_refused_when_stored(in_acme):
    with pytest.raises(CredentialError, match="api_format.*'openai', 'anthropic'"):
        credential_set(connector="model", secrets={"api_key": "sk-x", "api_format": "gemini"})
    with pytest.raises(CredentialError, match="'api_format' must be a string"):
        credential_set(connector="model", secrets={"api_key": "sk-x", "api_format": 1})


def test_a_tenant_definition_runs_on_anthropic_and_calls_its_mcp_tool(in_acme, fake_anthropic,
                                                                      mcp_server):
    """In this process, through runs/definitions: the model (Anthropic) asks for the MCP tool,
    the runner calls it through the ledger, and the tool's result goes back as a tool_result."""
    credential_set(connector="model", label="claude", secrets=creds(fake_anthropic))
    credential_set(connector="mcp", label="docs", secrets={"url": mcp_server.url})
    fake_anthropic.script = [{"tool_use": {"name": "lookup", "input": {"query": "ledger"}}}]
    definition_create(name="librarian", by="test", spec={
        "model": {"credential": "claude", "name": "claude-sonnet-4-5", "max_tokens": 256},
        "instructions": "Look things up before answering.",
        "tools": [{"name": "lookup", "kind": "mcp", "server": "docs", "remote_name": "search",
                   "description": "Search the docs",
                   "parameters": {"type": "object", "required": ["query"],
                                  "properties": {"query": {"type": "string"}}}}]})
    run = finished(start("librarian", input={"question": "what happens once?"}).id)
    assert run.status == Run.Status.SUCCEEDED, run.error
    assert run.result["turns"] == 2 and "Effects happen once." in run.result["content"]
    assert mcp_server.state()["calls"] == {"search": [{"query": "ledger", "limit": 3}]}
    sent = fake_anthropic.last_request  # the second turn: the whole conversation so far
    assert sent["system"] == "Look things up before answering."
    assert [m["role"] for m in sent["messages"]] == ["user", "assistant", "user"]
    [use] = sent["messages"][1]["content"]
    [result] = sent["messages"][2]["content"]
    assert use["type"] == "tool_use" and use["input"] == {"query": "ledger"}
    assert result["type"] == "tool_result" and result["tool_use_id"] == use["id"]
    assert sent["tools"][0]["name"] == "lookup" and "input_schema" in sent["tools"][0]
    connectors = Effect.objects.filter(run=run).values_list("connector", flat=True)
    assert sorted(connectors) == ["mcp", "model", "model"]
    assert run.tokens_used == fake_anthropic.state()["input_tokens"] + fake_anthropic.state()["output_tokens"]
