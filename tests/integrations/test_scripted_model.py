"""The scripted model server's contract (integrations/scripted_model.py): a labelled stand-in
that speaks Chat Completions from a script, as its own process, and through the model
connector like any provider."""

import json
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from integrations.connectors import Call, ConnectorError, connector_get
from integrations.scripted_model import FINGERPRINT, ScriptedModel
from tests.support.fakes.fixtures import scripted_model  # noqa: F401
from tests.support.fakes.smtp import free_port
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = {"scripts": {"m": [
    {"tool_calls": [{"name": "pay", "arguments": {"amount": "{{input.invoice.amount}}",
                                                  "memo": "invoice {{input.invoice.id}}"}}]},
    {"content": "paid {{tool.pay.id}} for {{input.invoice.id}}"}]}}


def _chat(url, body, key="sk-any"):
    request = urllib.request.Request(f"{url}/v1/chat/completions", data=json.dumps(body).encode(),
                                     method="POST", headers={"Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            return answer.status, json.load(answer)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


def _state(url):
    try:
        with urllib.request.urlopen(f"{url}/v1/state", timeout=2) as answer:
            return json.load(answer)
    except OSError:
        return None


def test_it_runs_as_its_own_process_plays_the_script_by_turn_and_says_what_it_is(tmp_path):
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "integrations.scripted_model", "--port", str(port),
                                "--script", str(script)], cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _state(url) is not None, timeout=20, what="the scripted server to listen")
        opening = [{"role": "user", "content": json.dumps({"invoice": {"id": "INV-1", "amount": 700}})}]
        status, first = _chat(url, {"model": "m", "messages": opening})
        assert status == 200 and first["system_fingerprint"] == FINGERPRINT == \
            "scripted-model-server, not a model"
        [choice] = first["choices"]
        assert choice["finish_reason"] == "tool_calls"
        [call] = choice["message"]["tool_calls"]
        assert call["function"]["name"] == "pay"
        assert json.loads(call["function"]["arguments"]) == {"amount": 700, "memo": "invoice INV-1"}
        conversation = opening + [choice["message"], {"role": "tool", "tool_call_id": call["id"],
                                                      "content": json.dumps({"id": "ch_9"})}]
        status, second = _chat(url, {"model": "m", "messages": conversation})
        assert second["choices"][0]["message"]["content"] == "paid ch_9 for INV-1"
        assert second["choices"][0]["finish_reason"] == "stop" and second["usage"]["total_tokens"] > 0
        assert _chat(url, {"model": "m", "messages": opening})[1]["choices"] == first["choices"]  # stateless
        answered = conversation + [second["choices"][0]["message"]]
        status, ended = _chat(url, {"model": "m", "messages": answered})
        assert status == 400 and "has 2 turns" in ended["error"]["message"]
        assert _chat(url, {"model": "other", "messages": opening})[0] == 404
        assert _chat(url, {"model": "m", "messages": opening}, key="")[0] == 401
        state = _state(url)
        assert state["by_turn"] == {"m:0": 2, "m:1": 1, "m:2": 1, "other:0": 1}
    finally:
        process.terminate()
        process.wait(timeout=10)


@pytest.mark.parametrize("document, problem", [
    ({"m": []}, "a script file is"),
    ({"scripts": {"m": []}}, "non-empty list"),
    ({"scripts": {"m": [{"text": "hi"}]}}, '{"content": ...}'),
    ({"scripts": {"m": [{"content": "a", "repeat": True}, {"content": "b"}]}}, "only the last"),
    ({"scripts": {"m": [{"tool_calls": [{"arguments": {}}]}]}}, "needs a name"),
])
def test_a_script_that_cannot_be_played_is_refused_with_where(document, problem):
    with pytest.raises(ValueError, match=problem.replace("{", r"\{").replace(".", r"\.")):
        ScriptedModel().script_set(document)


def test_the_model_connector_talks_to_it_like_a_provider(scripted_model):  # noqa: F811
    scripted_model.script({"m": [{"content": "hello", "repeat": True}]})
    model = connector_get("model")
    call = Call(tenant="acme", run_id=uuid.uuid4(), effect="turn", idempotency_key="k1",
                args={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
                credentials={"api_key": "sk-x", "base_url": scripted_model.base_url})
    assert model.execute(call)["content"] == "hello"
    with pytest.raises(ConnectorError, match="no script for model"):
        model.execute(Call(**{**call.__dict__, "args": {**call.args, "model": "gpt-4o"}}))
    assert scripted_model.state()["by_key"] == {"k1": 2}
