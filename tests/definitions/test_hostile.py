"""A tenant's definition, and the arguments its model writes, are hostile: what they may not make
the web process or a worker do (fetch a URL, read a file, hang, recurse) and the approval rules
they may not slip past."""

import http.server
import json
import math
import threading

import pytest

from runs.agents import Agent
from runs.definitions.runner import _calls_read
from runs.definitions.spec import DefinitionInvalid, definition_parse

SPEC = {"model": {"name": "m"}, "instructions": "hi", "tools": []}


@pytest.fixture
def json_server():
    """A loopback server answering any GET with a JSON Schema, counting the requests."""
    hits = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            hits.append(self.path)
            body = json.dumps({"type": "string"}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", hits
    server.shutdown()
    server.server_close()


def test_a_remote_ref_in_an_input_schema_is_never_fetched(json_server):
    url, hits = json_server
    spec = {**SPEC, "input_schema": {"type": "object", "properties": {"x": {"$ref": f"{url}/s.json"}}},
            "input_example": {"x": 1}}
    with pytest.raises(DefinitionInvalid) as caught:
        definition_parse("a", spec)
    assert "input_schema" in caught.value.fields
    assert hits == []


def test_a_ref_resolved_against_a_remote_id_is_never_fetched(json_server):
    url, hits = json_server
    spec = {**SPEC, "input_schema": {"$id": f"{url}/", "type": "object",
                                     "properties": {"x": {"$ref": "meta-data.json"}}}}
    with pytest.raises(DefinitionInvalid):
        definition_parse("a", spec)
    agent = Agent("a", version=1, definition=object(),
                  input_schema={"$id": f"{url}/", "properties": {"x": {"$ref": "m.json"}}})
    assert agent.input_errors({"x": 1})  # an error, not a fetch
    assert hits == []


def test_a_file_ref_in_tool_parameters_reads_no_file_in_the_worker(tmp_path):
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps({"enum": ["the-secret-value"]}))
    spec = {**SPEC, "tools": [{"name": "t", "kind": "mcp", "server": "s", "parameters": {
        "type": "object", "properties": {"x": {"$ref": secret.as_uri()}}}}]}
    with pytest.raises(DefinitionInvalid) as caught:
        definition_parse("a", spec)
    assert "tools[0].parameters" in caught.value.fields
    assert "the-secret-value" not in json.dumps(caught.value.fields)


def test_local_refs_still_work():
    spec = {**SPEC, "input_schema": {"type": "object", "$defs": {"id": {"type": "string"}},
                                     "properties": {"x": {"$ref": "#/$defs/id"}}},
            "input_example": {"x": "a"}}
    assert definition_parse("a", spec).input_schema
    bad = {**spec, "input_example": {"x": 1}}
    with pytest.raises(DefinitionInvalid) as caught:
        definition_parse("a", bad)
    assert "input_example" in caught.value.fields


def test_a_schema_that_refers_to_itself_without_end_is_refused_not_a_crash():
    spec = {**SPEC, "input_schema": {"$ref": "#"}, "input_example": {}}
    with pytest.raises(DefinitionInvalid) as caught:
        definition_parse("a", spec)
    assert "refers to itself without end" in caught.value.fields["input_example"][0]
    tool = definition_parse("a", {**SPEC, "tools": [
        {"name": "t", "kind": "mcp", "server": "s",
         "parameters": {"type": "object", "allOf": [{"$ref": "#"}]}}]}).tools[0]
    assert tool.argument_errors({"x": 1})  # an error the model reads, not a RecursionError


def test_a_rule_asks_when_the_argument_is_not_a_finite_number():
    tool = definition_parse("a", {**SPEC, "tools": [
        {"name": "t", "kind": "mcp", "server": "s", "approval": {"argument": "amount", "above": 500},
         "parameters": {"type": "object", "properties": {"amount": {"type": "number"}}}}]}).tools[0]
    for amount in (math.nan, math.inf, -math.inf):
        assert tool.approval.needed({"amount": amount}), amount
    below = definition_parse("a", {**SPEC, "tools": [
        {"name": "t", "kind": "mcp", "server": "s", "approval": {"argument": "amount", "below": 5}}]})
    assert below.tools[0].approval.needed({"amount": math.nan})
    assert not tool.approval.needed({"amount": 500})


def test_arguments_nested_past_the_parser_are_unreadable_not_a_crashed_turn():
    deep = "[" * 5000 + "]" * 5000
    (call,) = _calls_read([{"id": "c1", "function": {"name": "t", "arguments": deep}}], turn=1)
    assert call["arguments"] == {} and "nested" in call["unreadable"]


def _within(seconds: float, fn):
    """fn's answer, or a failure if it takes longer (the thread is left to finish on its own)."""
    answer = []
    thread = threading.Thread(target=lambda: answer.append(fn()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert answer, f"still running after {seconds}s"
    return answer[0]


def test_a_backtracking_pattern_cannot_hold_a_worker():
    tool = definition_parse("a", {**SPEC, "tools": [
        {"name": "t", "kind": "mcp", "server": "s",
         "parameters": {"type": "object", "properties": {"x": {"type": "string", "pattern": "^(a+)+$"}}}}]}
    ).tools[0]
    assert _within(5, lambda: tool.argument_errors({"x": "a" * 64 + "!"}))
    assert tool.argument_errors({"x": "aaa"}) == []
    agent = Agent("a", version=1, definition=object(),
                  input_schema={"properties": {"x": {"pattern": "^(a|aa)+$"}}})
    assert _within(5, lambda: agent.input_errors({"x": "a" * 64 + "!"}))


@pytest.mark.parametrize("schema, says", [
    ({"type": "string", "pattern": "^(a)\\1$"}, "cannot run here"),
    ({"type": "string", "pattern": "^(?=a)"}, "cannot run here"),
    ({"type": "object", "patternProperties": {"^(a+)+$": {}}}, "patternProperties"),
])
def test_patterns_that_cannot_run_in_linear_time_are_refused_on_write(schema, says):
    spec = {**SPEC, "input_schema": {"type": "object", "properties": {"x": schema}}}
    with pytest.raises(DefinitionInvalid) as caught:
        definition_parse("a", spec)
    assert says in caught.value.fields["input_schema"][0]


def test_a_loose_connector_schema_cannot_pass_the_effect_its_credential_or_name():
    tool = definition_parse("a", {**SPEC, "tools": [
        {"name": "post", "kind": "connector", "action": "webhook.post", "parameters": {"type": "object"}}]}
    ).tools[0]
    for key in ("credential", "name", "connector"):
        problems = tool.argument_errors({"url": "https://example.com/", "payload": {}, key: "other"})
        assert problems == [f"$.{key}: not an argument a tool may pass (the definition chooses it)"]
    assert tool.argument_errors({"url": "https://example.com/", "payload": {}}) == []

    def effect(name, connector, *, credential="default", **args):  # ctx.effect's signature
        return args

    with pytest.raises(TypeError):  # what a worker did with such a call before it was refused
        effect("tool:c1", "webhook", credential="default", **{"credential": "other"})


@pytest.mark.parametrize("text", ['{"amount": NaN}', '{"amount": 1e999}', '{"amount": -Infinity}'])
def test_arguments_with_numbers_json_has_not_are_unreadable(text):
    """PostgreSQL's jsonb refuses NaN and Infinity: kept in the run's state they failed every
    checkpoint of the step; and NaN passes no approval rule's comparison."""
    (call,) = _calls_read([{"id": "c1", "function": {"name": "t", "arguments": text}}], turn=1)
    assert call["arguments"] == {} and "finite" in call["unreadable"]


@pytest.mark.parametrize("text", ['{"x": "a\\u0000b"}', '{"x\\u0000": 1}', '{"x": "\\ud800"}'])
def test_arguments_jsonb_cannot_store_are_unreadable(text):
    """U+0000 and lone surrogates parse to Python strings that PostgreSQL's jsonb refuses: kept
    in the run's state, they failed every checkpoint of the step."""
    (call,) = _calls_read([{"id": "c1", "function": {"name": "t", "arguments": text}}], turn=1)
    assert call["arguments"] == {} and call["unreadable"]
