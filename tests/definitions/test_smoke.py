"""A tenant's definition runs end to end in this process: stored, found by name, one turn."""

import pytest

from integrations.services import credential_set
from runs.agents import registry
from runs.definitions.services import definition_create, definition_update
from runs.models import Run
from tests.support.fakes.fixtures import fake_openai  # noqa: F401
from tests.support.runs import finished, start

SPEC = {"model": {"name": "gpt-4o-mini"}, "instructions": "Answer briefly."}


@pytest.fixture
def model_credential(in_acme, fake_openai):  # noqa: F811
    credential_set(connector="model", secrets={"api_key": "sk-test", "base_url": fake_openai.url + "/v1"})
    return fake_openai


def test_a_definition_runs_one_turn_and_finishes_with_the_answer(model_credential):
    definition_create(name="helper", spec=SPEC, by="test")
    run = finished(start("helper", input={"question": "hi"}).id)
    assert run.status == Run.Status.SUCCEEDED, run.error
    assert run.result["content"].startswith("echo: ") and run.result["turns"] == 1
    assert registry.get("helper").kind == "tenant"
    v2 = definition_update(name="helper", spec={**SPEC, "instructions": "Answer at length."})
    assert v2.version == 2 and registry.get("helper").version == 2
    assert registry.get("helper", 1).topology_hash != registry.get("helper", 2).topology_hash
