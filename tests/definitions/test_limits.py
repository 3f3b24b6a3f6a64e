"""Limits of tenant-defined agents: the definition's, else the tenant's defaults, else the
platform's; one tenant's defaults are not another's."""

import pytest
from django_tenants.utils import tenant_context

from integrations.services import credential_set
from runs.definitions.limits import limits_effective
from runs.definitions.models import AgentLimits
from runs.definitions.services import DefinitionError, agent_limits_set
from tests.support.runs import start

from .conftest import define


@pytest.fixture
def acme_defaults(in_acme):
    yield agent_limits_set
    AgentLimits.objects.all().delete()


def test_the_definition_wins_then_the_tenant_then_the_platform(settings):
    settings.AGENT_DEFAULT_LIMITS = {"max_turns": 50, "max_tokens": 1000, "max_cost_usd": None}
    assert limits_effective({"max_turns": 3}, {"max_turns": 9, "max_tokens": 77, "max_cost_usd": 2}) == \
        {"max_turns": 3, "max_tokens": 77, "max_cost_usd": 2}
    assert limits_effective({}, None) == {"max_turns": 50, "max_tokens": 1000}


def test_a_tenant_default_applies_to_its_agents_that_set_none_and_not_to_another_tenant(
        acme_defaults, globex, model):
    acme_defaults(limits={"max_tokens": 4321, "max_turns": 2, "max_cost_usd": None}, by="ann")
    own = define("frugal", tools=[], limits={"max_tokens": 999})
    bare = define("bare", tools=[])
    assert start(bare).max_tokens == 4321
    assert start(own).max_tokens == 999  # the definition's own limit wins
    with tenant_context(globex):
        AgentLimits.objects.all().delete()
        credential_set(connector="model", secrets={"api_key": "sk-scripted", "base_url": model.base_url})
        other = define("bare", tools=[])
        assert start(other).max_tokens != 4321


@pytest.mark.parametrize("limits, field", [
    ({"max_turns": 0}, "limits.max_turns"), ({"max_turns": 1.5}, "limits.max_turns"),
    ({"max_turns": 10_000}, "limits.max_turns"), ({"max_steps": 3}, "limits.max_steps"),
    ({"max_cost_usd": "5"}, "limits.max_cost_usd"), ([], "limits")])
def test_wrong_tenant_defaults_are_refused_with_the_field(acme_defaults, limits, field):
    with pytest.raises(DefinitionError) as refused:
        acme_defaults(limits=limits, by="ann")
    assert refused.value.code == "invalid_limits" and field in refused.value.fields
    assert not AgentLimits.objects.exists()
