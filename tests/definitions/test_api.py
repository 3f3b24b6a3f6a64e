"""The REST API of agents: a tenant defines, versions, lists, reads and retires its own agents
beside the platform's; a bad definition is refused with the definition language's fields; a run
started through the API is pinned to its version; another tenant sees none of it."""

import json
import re
import uuid

import pytest
from django_tenants.utils import tenant_context

from integrations.services import credential_set
from runs.agents import registry
from runs.approvals.models import Approval
from runs.definitions.runner import STEPS_PER_TURN
from runs.definitions.spec import MAX_SPEC_BYTES, DefinitionInvalid, definition_parse
from runs.models import Run
from tenants.services import api_key_create
from tests.dashboard.conftest import person, signed_in
from tests.support.api import api_client
from tests.support.fakes import FakeServer
from tests.support.runs import finished
from tests.support.waiting import wait_for


class AskingModel(FakeServer):
    """A stand-in model provider (Chat Completions): its first reply in a conversation calls the
    tool `ask`, every later one answers. It keeps each request, to show which instructions a
    turn was sent with."""

    name = "asking-model"

    def reset(self) -> None:
        with self.lock:
            self.requests: list[dict] = []

    def state(self) -> dict:
        with self.lock:
            return {"requests": len(self.requests)}

    def handle(self, method, path, query, headers, raw):
        request = json.loads(raw)
        with self.lock:
            self.requests.append(request)
        answered = any(m.get("role") == "assistant" for m in request["messages"])
        if answered:
            message, finish = {"role": "assistant", "content": "done"}, "stop"
        else:
            call = {"id": "call_ask", "type": "function",
                    "function": {"name": "ask", "arguments": json.dumps({"question": "may I?"})}}
            message, finish = {"role": "assistant", "content": None, "tool_calls": [call]}, "tool_calls"
        return 200, {"id": "chatcmpl-1", "object": "chat.completion", "model": request["model"],
                     "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                     "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}, {}


@pytest.fixture
def model():
    server = AskingModel().start()
    yield server
    server.stop()


def _name(prefix: str = "agent") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def labels(acme, model):
    """Credentials of acme's own, under fresh labels: a model (the stand-in) and payments."""
    label = f"l{uuid.uuid4().hex[:10]}"
    with tenant_context(acme):
        credential_set(connector="model", label=label,
                       secrets={"api_key": "sk-test", "base_url": model.url + "/v1"})
        credential_set(connector="payments", label=label, secrets={"api_key": "sk_test_acme"})
    return label


def _spec(label: str, **changes) -> dict:
    return {"description": "Asks before it answers",
            "model": {"credential": label, "name": "stand-in", "max_tokens": 64},
            "instructions": "Ask first.",
            "input_schema": {"type": "object", "required": ["invoice"],
                             "properties": {"invoice": {"type": "object", "required": ["amount"],
                                                        "properties": {"amount": {"type": "integer"}}}}},
            "tools": [{"name": "ask", "kind": "wait_for_approval", "description": "ask a person"},
                      {"name": "pay", "kind": "connector", "action": "payments.charge",
                       "credential": label, "approval": {"argument": "amount", "above": 500}}],
            **changes}


def _create(api, name: str, spec: dict):
    return api.post("/api/v1/agents", {"name": name, "definition": spec}, format="json")


def _put(api, name: str, spec: dict):
    return api.put(f"/api/v1/agents/{name}", {"definition": spec}, format="json")


def _listed(api) -> dict:
    response = api.get("/api/v1/agents")
    assert response.status_code == 200
    return {agent["name"]: agent for agent in response.json()["results"]}


INPUT = {"invoice": {"amount": 120}}


# -- define, version, list, read, retire -------------------------------------------------------

def test_an_agent_is_created_versioned_listed_read_and_retired(acme_api, labels):
    name, spec = _name(), _spec(labels)
    created = _create(acme_api, name, spec)
    assert created.status_code == 201, created.json()
    v1 = created.json()
    assert (v1["name"], v1["version"], v1["kind"], v1["created"]) == (name, 1, "tenant", True)
    assert v1["definition"]["instructions"] == "Ask first." and v1["created_by"].startswith("api:")
    assert _create(acme_api, name, spec).json()["error"]["code"] == "definition_exists"
    assert _create(acme_api, name, spec).status_code == 409

    same = _put(acme_api, name, spec)
    assert same.status_code == 200 and same.json()["created"] is False and same.json()["version"] == 1
    v2 = _put(acme_api, name, {**spec, "instructions": "Ask twice."})
    assert v2.status_code == 200 and v2.json()["created"] is True and v2.json()["version"] == 2
    assert v2.json()["topology_hash"] != v1["topology_hash"]

    listed = _listed(acme_api)
    assert listed["research"]["kind"] == "platform" and listed["research"]["definition"] is None
    assert listed["research"]["steps"]["plan"] == ["investigate"]
    mine = listed[name]
    assert (mine["kind"], mine["version"], mine["versions"]) == ("tenant", 2, [1, 2])
    assert mine["description"] == "Asks before it answers"
    assert mine["input_schema"]["required"] == ["invoice"]
    assert mine["definition"]["instructions"] == "Ask twice."
    assert mine["topology_hash"] == v2.json()["topology_hash"]

    detail = acme_api.get(f"/api/v1/agents/{name}").json()
    assert (detail["kind"], detail["version"], detail["retired"]) == ("tenant", 2, False)
    assert [v["version"] for v in detail["versions"]] == [2, 1]
    old = acme_api.get(f"/api/v1/agents/{name}/versions/1")
    assert old.status_code == 200 and old.json()["definition"]["instructions"] == "Ask first."
    assert acme_api.get(f"/api/v1/agents/{name}/versions/3").status_code == 404
    assert acme_api.get("/api/v1/agents/research").json()["kind"] == "platform"
    assert acme_api.get("/api/v1/agents/research/versions/1").json()["definition"] is None

    retired = acme_api.delete(f"/api/v1/agents/{name}")
    assert retired.status_code == 200 and retired.json()["retired"] is True
    assert retired.json()["version"] is None
    assert name not in _listed(acme_api)
    started = acme_api.post("/api/v1/runs", {"agent": name, "input": INPUT}, format="json")
    assert started.status_code == 409 and started.json()["error"]["code"] == "agent_retired"
    pinned = acme_api.post("/api/v1/runs", {"agent": name, "version": 1, "input": INPUT}, format="json")
    assert pinned.status_code == 409
    assert acme_api.get(f"/api/v1/agents/{name}/versions/2").json()["retired_at"] is not None

    back = _put(acme_api, name, spec)  # a PUT brings a retired agent back, as a new version
    assert back.status_code == 200 and back.json()["version"] == 3
    assert _listed(acme_api)[name]["versions"] == [1, 2, 3]


def test_a_run_of_a_retired_agent_finishes_on_its_version(acme, acme_api, labels, model):
    name = _name()
    assert _create(acme_api, name, _spec(labels, tools=[])).status_code == 201
    started = acme_api.post("/api/v1/runs", {"agent": name, "input": INPUT}, format="json")
    assert started.status_code == 201, started.json()
    assert acme_api.delete(f"/api/v1/agents/{name}").status_code == 200
    with tenant_context(acme):
        run = _advanced(started.json()["id"], until=Run.Status.SUCCEEDED)
    assert run.result["content"] == "done" and run.agent_version == 1


def test_the_platforms_agents_cannot_be_changed_or_retired(acme_api, labels):
    for response in (_put(acme_api, "research", _spec(labels)), acme_api.delete("/api/v1/agents/research")):
        assert response.status_code == 403
        assert response.json()["error"]["code"] == "platform_agent"
        assert "platform" in response.json()["error"]["message"]
    taken = _create(acme_api, "research", _spec(labels))
    assert taken.status_code == 400 and list(taken.json()["error"]["fields"]) == ["name"]
    missing = _put(acme_api, _name(), _spec(labels))
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    assert acme_api.delete(f"/api/v1/agents/{_name()}").status_code == 404
    assert acme_api.get(f"/api/v1/agents/{_name()}").status_code == 404


# -- invalid definitions -----------------------------------------------------------------------

def _tool(label: str, **tool) -> dict:
    return {"name": "pay", "kind": "connector", "action": "payments.charge", "credential": label, **tool}


INVALID = {
    "unknown connector action": lambda label: {"tools": [_tool(label, action="fax.send")]},
    "tool name clash": lambda label: {"tools": [_tool(label), _tool(label, approval="always")]},
    "broken input schema": lambda label: {"input_schema": {"type": "no-such-type"}},
    "broken parameters schema": lambda label: {"tools": [_tool(label, parameters={"type": "object",
                                                                                 "required": "amount"})]},
    "unknown credential label": lambda label: {"tools": [_tool(label, credential="nobody-has-this")]},
    "unknown model credential": lambda label: {"model": {"credential": "nobody-has-this", "name": "x"}},
    "bad approval rule": lambda label: {"tools": [_tool(label, approval={"argument": "amount",
                                                                         "above": "a lot"})]},
    "rule with two operators": lambda label: {"tools": [_tool(label, approval={"argument": "amount",
                                                                               "above": 1, "below": 9})]},
    "bad limits": lambda label: {"limits": {"max_turns": 0, "max_cost_usd": "5", "max_naps": 3,
                                            "max_tokens": 10 ** 20}},
    "oversize": lambda label: {"input_example": {"blob": "x" * (MAX_SPEC_BYTES + 1)}},
    "unknown field": lambda label: {"personality": "cheerful"},
    # a typo in a rule's argument would make every call wait for a person: refused instead
    "rule on an undeclared argument": lambda label: {"tools": [_tool(label, approval={
        "argument": "amout", "above": 500})]},
    "numeric rule on a text argument": lambda label: {"tools": [_tool(label, approval={
        "argument": "currency", "above": 500})]},
    "rule without an argument": lambda label: {"tools": [_tool(label, approval={"above": 500})]},
}
EXPECTED_PATHS = {
    "unknown connector action": {"tools[0].action"},
    "tool name clash": {"tools[1].name"},
    "broken input schema": {"input_schema"},
    "broken parameters schema": {"tools[0].parameters"},
    "unknown credential label": {"tools[0].credential"},
    "unknown model credential": {"model.credential"},
    "bad approval rule": {"tools[0].approval.above"},
    "rule with two operators": {"tools[0].approval"},
    "bad limits": {"limits.max_turns", "limits.max_cost_usd", "limits.max_naps", "limits.max_tokens"},
    "oversize": {"definition"},
    "unknown field": {"personality"},
    "rule on an undeclared argument": {"tools[0].approval.argument"},
    "numeric rule on a text argument": {"tools[0].approval.argument"},
    "rule without an argument": {"tools[0].approval.argument"},
}


@pytest.mark.parametrize("case", sorted(INVALID))
def test_an_invalid_definition_is_refused_with_the_fields_the_definition_language_names(
        case, acme, acme_api, labels):
    name = _name()
    spec = {**_spec(labels), **INVALID[case](labels)}
    with tenant_context(acme):
        credentials = {("model", labels), ("payments", labels)}
        with pytest.raises(DefinitionInvalid) as expected:
            definition_parse(name, spec, credentials=credentials, reserved_names=registry.names())
    for response in (_create(acme_api, name, spec), _put(acme_api, _created(acme_api, labels), spec)):
        assert response.status_code == 400, response.json()
        error = response.json()["error"]
        assert error["code"] == "invalid_definition"
        assert error["fields"] == expected.value.fields
        assert set(error["fields"]) == EXPECTED_PATHS[case]
    assert acme_api.get(f"/api/v1/agents/{name}").status_code == 404  # nothing was stored


def _created(api, label: str) -> str:
    name = _name()
    assert _create(api, name, _spec(label)).status_code == 201
    return name


def test_a_body_that_is_not_a_definition_is_refused(acme_api):
    for body in ({"name": _name()}, {"name": _name(), "definition": "a string"},
                 {"name": 7, "definition": {}}):
        response = acme_api.post("/api/v1/agents", body, format="json")
        assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_request"
    refused = acme_api.post("/api/v1/agents", {"name": "Not A Name", "definition": {}}, format="json")
    assert refused.json()["error"]["code"] == "invalid_definition"
    assert {"name", "instructions", "model"} <= set(refused.json()["error"]["fields"])


# -- scopes and tenants ------------------------------------------------------------------------

def test_a_key_without_agents_write_reads_agents_but_does_not_write_them(acme, acme_api, labels):
    name = _created(acme_api, labels)
    _, plaintext = api_key_create(tenant=acme, name=_name("reader"), scopes=["runs:read", "runs:write"])
    reader = api_client(plaintext)
    assert name in _listed(reader)
    assert reader.get(f"/api/v1/agents/{name}").status_code == 200
    assert reader.get("/api/v1/agent-limits").status_code == 200
    for response in (_create(reader, _name(), _spec(labels)), _put(reader, name, _spec(labels, tools=[])),
                     reader.delete(f"/api/v1/agents/{name}"),
                     reader.put("/api/v1/agent-limits", {"limits": {}}, format="json")):
        assert response.status_code == 403
        assert response.json()["error"]["code"] == "insufficient_scope"
        assert "agents:write" in response.json()["error"]["message"]
    assert acme_api.get(f"/api/v1/agents/{name}").json()["version"] == 1  # nothing changed


def test_another_tenant_cannot_see_run_change_or_reference_an_agent_or_its_credential(
        acme_api, globex_api, labels):
    name = _created(acme_api, labels)
    assert name not in _listed(globex_api)
    assert globex_api.get(f"/api/v1/agents/{name}").status_code == 404
    assert globex_api.get(f"/api/v1/agents/{name}/versions/1").status_code == 404
    started = globex_api.post("/api/v1/runs", {"agent": name, "input": INPUT}, format="json")
    assert started.status_code == 404 and started.json()["error"]["code"] == "unknown_agent"
    assert _put(globex_api, name, _spec(labels)).status_code == 404
    assert globex_api.delete(f"/api/v1/agents/{name}").status_code == 404
    # acme's credential labels are not globex's: a definition naming them is refused there
    refused = _create(globex_api, _name(), _spec(labels))
    assert refused.status_code == 400
    assert set(refused.json()["error"]["fields"]) == {"model.credential", "tools[1].credential"}
    assert acme_api.get(f"/api/v1/agents/{name}").json()["version"] == 1


# -- runs of tenant agents ---------------------------------------------------------------------

def _cancel(api, *runs: dict) -> None:
    """Runs only started to read how: none of them is left in line for a later test's worker."""
    for run in runs:
        assert api.post(f"/api/v1/runs/{run['id']}/cancel").status_code == 202


def _advanced(run_id, *, until: str) -> Run:
    """Advance the run here (a worker of another test may hold it: then wait for that one)."""
    finished(run_id)
    return wait_for(lambda: (run := Run.objects.get(id=run_id)).status == until and run,
                    what=f"run {run_id} to be {until}")


def test_a_run_through_the_api_pins_its_version_and_a_put_while_it_waits_leaves_it_there(
        acme, acme_api, labels, model):
    name = _name()
    v1 = _create(acme_api, name, _spec(labels)).json()
    invalid = acme_api.post("/api/v1/runs", {"agent": name, "input": {"invoice": {"amount": "lots"}}},
                            format="json")
    assert invalid.status_code == 400 and invalid.json()["error"]["code"] == "invalid_input"
    assert "$.invoice.amount" in invalid.json()["error"]["message"]
    missing = acme_api.post("/api/v1/runs", {"agent": name, "input": {}}, format="json")
    assert missing.status_code == 400
    assert "'invoice' is a required property" in missing.json()["error"]["message"]

    started = acme_api.post("/api/v1/runs", {"agent": name, "input": INPUT}, format="json")
    assert started.status_code == 201, started.json()
    assert started.json()["agent_version"] == 1
    run_id = started.json()["id"]
    with tenant_context(acme):
        _advanced(run_id, until=Run.Status.WAITING)
        approval = Approval.objects.get(run_id=run_id)
        assert Run.objects.get(id=run_id).topology_hash == v1["topology_hash"]

    v2 = _put(acme_api, name, _spec(labels, instructions="Never ask."))
    assert v2.json()["version"] == 2
    latest = acme_api.post("/api/v1/runs", {"agent": name, "input": INPUT}, format="json").json()
    assert latest["agent_version"] == 2
    pinned = acme_api.post("/api/v1/runs", {"agent": name, "version": 1, "input": INPUT}, format="json")
    assert pinned.status_code == 201 and pinned.json()["agent_version"] == 1
    _cancel(acme_api, latest, pinned.json())
    unknown = acme_api.post("/api/v1/runs", {"agent": name, "version": 9, "input": INPUT}, format="json")
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "unknown_agent"

    decided = acme_api.post(f"/api/v1/approvals/{approval.id}/decide", {"decision": "approve"},
                            format="json")
    assert decided.status_code == 200, decided.json()
    with tenant_context(acme):
        run = _advanced(run_id, until=Run.Status.SUCCEEDED)
    assert run.agent_version == 1 and run.result["content"] == "done"
    # the turn after the approval (the only one with the tool's answer) had version 1's instructions
    resumed = [r for r in model.requests if any(m.get("tool_call_id") == "call_ask" for m in r["messages"])]
    assert resumed and {r["messages"][0]["content"] for r in resumed} == {"Ask first."}


# -- default limits ----------------------------------------------------------------------------

def test_limits_come_from_the_definition_then_the_tenant_then_the_platform(
        acme, acme_api, labels, settings):
    settings.AGENT_DEFAULT_LIMITS = {"max_turns": 9, "max_wall_seconds": 77.0}
    bare = _created(acme_api, labels)
    own = _name()
    assert _create(acme_api, own, _spec(labels, limits={"max_turns": 2, "max_tokens": 50})).status_code == 201
    try:
        limits = acme_api.put("/api/v1/agent-limits", {"limits": {"max_turns": 4, "max_tokens": 1000,
                                                                 "max_cost_usd": 0.5}}, format="json")
        assert limits.status_code == 200, limits.json()
        assert limits.json()["tenant"] == {"max_turns": 4, "max_tokens": 1000, "max_cost_usd": 0.5}
        assert limits.json()["platform"] == {"max_turns": 9, "max_wall_seconds": 77.0}
        assert limits.json()["effective"] == {"max_turns": 4, "max_tokens": 1000, "max_cost_usd": 0.5,
                                              "max_wall_seconds": 77.0}
        assert acme_api.get("/api/v1/agent-limits").json() == limits.json()

        def run_of(agent):
            response = acme_api.post("/api/v1/runs", {"agent": agent, "input": INPUT}, format="json")
            assert response.status_code == 201, response.json()
            _cancel(acme_api, response.json())
            return response.json()

        tenant_default = run_of(bare)
        assert tenant_default["max_tokens"] == 1000 and float(tenant_default["max_cost_usd"]) == 0.5
        assert tenant_default["max_wall_seconds"] == 77.0
        assert tenant_default["max_steps"] == 4 * STEPS_PER_TURN + 2  # max_turns, as the runner counts steps
        definition = run_of(own)
        assert definition["max_tokens"] == 50 and definition["max_steps"] == 2 * STEPS_PER_TURN + 2
        assert float(definition["max_cost_usd"]) == 0.5

        bad = acme_api.put("/api/v1/agent-limits", {"limits": {"max_turns": 0, "max_naps": 1,
                                                               "max_cost_usd": 10 ** 7}}, format="json")
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_limits"
        assert bad.json()["error"]["fields"] == {
            "limits.max_turns": ["must be a positive integer"],
            "limits.max_naps": ["unknown limit; known: ['max_cost_usd', 'max_tokens', 'max_turns', "
                                "'max_wall_seconds']"],
            "limits.max_cost_usd": ["must be at most 999999"]}
        assert acme_api.get("/api/v1/agent-limits").json()["tenant"]["max_turns"] == 4
    finally:  # acme is shared by the suite: its agents go back to the platform's defaults
        assert acme_api.put("/api/v1/agent-limits", {"limits": {}}, format="json").status_code == 200
    assert run_of(bare)["max_steps"] == 9 * STEPS_PER_TURN + 2


def test_a_name_no_agent_can_have_is_no_such_agent(acme_api, labels):
    for name in ("%00", "a%00b", "UPPER", "x" * 80):
        assert acme_api.get(f"/api/v1/agents/{name}").status_code == 404
        assert acme_api.get(f"/api/v1/agents/{name}/versions/1").status_code == 404
        assert _put(acme_api, name, _spec(labels)).status_code == 404
        assert acme_api.delete(f"/api/v1/agents/{name}").status_code == 404


def test_the_dashboards_run_filter_offers_the_tenants_agents_beside_the_platforms(acme, acme_api, labels):
    name = _created(acme_api, labels)
    page = signed_in(person(acme, "viewer")).get("/t/acme/runs")
    assert page.status_code == 200
    offered = re.findall(r'<option value="([^"]+)"></option>', page.content.decode())
    assert name in offered and "research" in offered
