"""The agents page: versions, steps pictures and runs per version (draining), per tenant."""

import re
import uuid

import pytest
from django_tenants.utils import tenant_context

from runs.agents import Agent, registry
from runs.models import Run
from runs.transitions import finish, goto
from tests.support.runs import finished, start


@pytest.fixture
def drainer():
    """An agent with two versions, registered in this test process only (a fresh name each
    time: the tests share one database)."""
    made, name = [], f"drainer-{uuid.uuid4().hex[:6]}"
    for version in (1, 2):
        agent = Agent(name, version=version, description=f"Drains, take {version}.")

        @agent.step(start=True, next=["settle"])
        def begin(ctx, state):
            return goto("settle")

        @agent.step(next=[])
        def settle(ctx, state):
            return finish(None)

        if version == 2:
            agent.step(next=[], name="extra")(settle)
        made.append(agent)
    yield made
    for agent in made:
        registry.unregister(agent.name, agent.version)


def versions_table(html: str) -> dict[str, str]:
    """Each version's table row (as text) on the page."""
    rows = re.findall(r"<tr>\s*<th scope=\"row\">(v\d+)</th>(.*?)</tr>", html, flags=re.S)
    return {version: " ".join(re.sub(r"<[^>]+>", " ", row).split()) for version, row in rows}


def test_every_agent_with_its_versions_and_the_steps_picture(as_role, drainer):
    response = as_role("viewer").get("/t/acme/agents")
    assert response.status_code == 200
    html = response.content.decode()
    for name in ("waiter", "chatter", drainer[0].name):
        assert f'/t/acme/agents/{name}"' in html
    assert "Drains, take 2." in html  # the newest version's description
    assert 'role="img"' in html and f"Steps of {drainer[0].name} version 2" in html
    assert drainer[1].topology_hash[:12] in html


def test_runs_per_version_and_which_are_draining(acme, globex, as_role, drainer):
    with tenant_context(acme):
        for _ in range(2):
            start(drainer[0].name, version=1)  # queued on the old version: draining
        assert finished(start(drainer[0].name, version=1).id).status == Run.Status.SUCCEEDED
        start(drainer[0].name, version=2)
    with tenant_context(globex):
        for _ in range(5):
            start(drainer[0].name, version=1)  # another tenant's runs are not counted

    html = as_role("viewer").get(f"/t/acme/agents/{drainer[0].name}").content.decode()
    rows = versions_table(html)
    # columns: topology, then queued running waiting succeeded failed cancelled, then state
    assert re.search(r"\b2 0 0 1 0 0 draining 2 unfinished$", rows["v1"]), rows["v1"]
    assert re.search(r"\b1 0 0 0 0 0 current$", rows["v2"]), rows["v2"]
    assert html.count('role="img"') == 2  # a picture per version on the agent's page
    assert "<code>extra</code>" not in html  # drawn, not listed, when dot works


def test_a_version_no_longer_registered_but_with_runs_is_shown(acme, as_role, drainer):
    with tenant_context(acme):
        start(drainer[0].name, version=1)
    registry.unregister(drainer[0].name, 1)
    html = as_role("viewer").get(f"/t/acme/agents/{drainer[0].name}").content.decode()
    assert "not registered" in versions_table(html)["v1"]


def test_an_unknown_agent_is_404_and_strangers_see_nothing(as_role, globex):
    assert as_role("viewer").get("/t/acme/agents/no-such-agent").status_code == 404
    assert as_role("viewer").get("/t/globex/agents").status_code == 404  # not a member


def test_when_dot_fails_the_steps_are_listed_in_words(as_role, drainer, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    html = as_role("viewer").get(f"/t/acme/agents/{drainer[0].name}").content.decode()
    assert "The picture could not be drawn." in html
    assert "<code>begin</code> → <code>settle</code>" in html
