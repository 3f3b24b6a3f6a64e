"""Agents' input schemas: run_start refuses input that breaks one (invalid_input, naming each
failing path), through the API too; agents without a schema take any object."""

import uuid

import pytest
from django_tenants.utils import tenant_context

from runs.agents import Agent, registry
from runs.services import RunError, run_start


def test_the_api_refuses_input_that_breaks_the_schema_with_the_paths(acme_api):
    response = acme_api.post("/api/v1/runs", {"agent": "onboarding", "input": {
        "employee": {"name": 7}, "hardware_timeout_seconds": -1}}, format="json")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid_input"
    assert "$.employee: 'email' is a required property" in error["message"]
    assert "$.employee.name: 7 is not of type 'string'" in error["message"]
    assert "$.hardware_timeout_seconds: -1 is less than or equal to the minimum of 0" in \
        error["message"]


def test_conforming_input_starts_and_agents_without_a_schema_take_any_object(acme):
    with tenant_context(acme):
        example = registry.get("onboarding").input_example
        assert run_start(agent="onboarding", input=example, enqueue=False).created
        assert run_start(agent="chatter", input={"anything": [1, 2]}, enqueue=False).created
        with pytest.raises(RunError) as refused:
            run_start(agent="research", input={"iterations": "three"}, enqueue=False)
        assert refused.value.code == "invalid_input"


def test_the_shipped_examples_match_their_schemas():
    for name in ("onboarding", "research"):
        agent = registry.get(name)
        assert agent.input_schema and agent.input_errors(agent.input_example) == []


def test_a_broken_schema_fails_when_the_agent_is_defined():
    with pytest.raises(Exception, match="is not valid under any of the given schemas|is not of type"):
        Agent("broken_schema", version=1, input_schema={"type": 12})
    registry.unregister("broken_schema", 1)


def test_the_api_list_takes_the_dashboards_filters(acme, acme_api):
    with tenant_context(acme):
        tag = f"api-{uuid.uuid4().hex[:8]}"
        mine = run_start(agent="research", input={"topic": tag}, enqueue=False).run
        run_start(agent="chatter", input={"tag": tag}, enqueue=False)
    found = acme_api.get("/api/v1/runs", {"text": tag.upper(), "agent": "research", "version": 1,
                                          "created_from": "2020-01-01T00:00:00Z"})
    assert found.status_code == 200, found.content
    assert [r["id"] for r in found.json()["results"]] == [str(mine.id)]
    later = acme_api.get("/api/v1/runs", {"text": tag, "created_to": "2020-01-01T00:00:00Z"})
    assert later.json()["results"] == []
    assert acme_api.get("/api/v1/runs", {"text": tag, "waiting_for": "approval"}).json()[
        "results"] == []
    bad = acme_api.get("/api/v1/runs", {"waiting_for": "godot", "created_from": "soon"})
    assert bad.status_code == 400 and set(bad.json()["error"]["fields"]) == {
        "waiting_for", "created_from"}
