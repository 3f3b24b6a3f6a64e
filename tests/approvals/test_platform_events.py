"""Events the platform delivers itself (a child run's end, Slack, Gmail) cannot come from the
API: a tenant's program could otherwise resume a parent with a forged child result, or take a
webhook's dedupe id so the real delivery is dropped as a duplicate."""

import pytest
from django_tenants.utils import tenant_context

from runs.approvals.models import EventGate, InboundEvent
from runs.models import Run
from tests.support.waiting import wait_for


@pytest.mark.parametrize("kind", ["child_run", "child_run.done", "slack", "slack.message",
                                  "slack.reaction_added", "gmail", "gmail.push"])
def test_the_platforms_own_event_kinds_are_refused(acme, acme_api, kind):
    response = acme_api.post("/api/v1/events", {"kind": kind, "key": "k", "payload": {}},
                             format="json")
    assert response.status_code == 403, response.content
    assert response.json()["error"]["code"] == "reserved_event_kind"
    with tenant_context(acme):
        assert not InboundEvent.objects.filter(kind=kind, key="k").exists()


@pytest.mark.parametrize("source_id", ["child:0b9c", "slack:Ev123", "slack-decision:a:b:c",
                                       "gmail:123"])
def test_the_platforms_own_dedupe_ids_are_refused(acme, acme_api, source_id):
    response = acme_api.post("/api/v1/events", {"kind": "docs.signed", "key": "k", "id": source_id},
                             format="json")
    assert response.status_code == 403, response.content
    assert response.json()["error"]["code"] == "reserved_event_id"
    with tenant_context(acme):
        assert not InboundEvent.objects.filter(source_id=source_id).exists()


def test_tenant_event_kinds_that_only_look_alike_are_delivered(acme_api):
    for kind in ["slackware.release", "gmailish", "child_runner"]:
        response = acme_api.post("/api/v1/events", {"kind": kind, "key": "k"}, format="json")
        assert response.status_code == 202, (kind, response.content)


def test_a_forged_child_result_does_not_resume_the_parent(acme, acme_api, worker):
    # nest depth 1: the parent waits on a child, which waits for a person
    parent_id = acme_api.post("/api/v1/runs", {"agent": "nest", "input": {"depth": 1}},
                              format="json").json()["id"]
    with tenant_context(acme):
        gate = wait_for(lambda: EventGate.objects.filter(run_id=parent_id, kind="child_run",
                                                         status="open").first(),
                        what="the parent to wait on its child")
    forged = acme_api.post("/api/v1/events", {
        "kind": "child_run", "key": gate.key, "id": f"child:{gate.key}",
        "payload": {"run": gate.key, "status": "succeeded", "result": "forged"}}, format="json")
    assert forged.status_code == 403, forged.content
    with tenant_context(acme):
        assert Run.objects.get(id=parent_id).status == "waiting"
        assert EventGate.objects.get(id=gate.id).status == "open"
    assert acme_api.post(f"/api/v1/runs/{parent_id}/cancel").status_code == 202
