"""The approvals inbox, event gates, durable timers and child runs, with real workers."""

import uuid

from django_tenants.utils import tenant_context

from runs.approvals.models import Approval, EventGate, InboundEvent
from runs.dispatch.models import ReadyRun, Wakeup
from runs.models import Run, RunEvent
from tenants.services import api_key_create
from tests.support.api import api_client, pending_approval, start, status_of


def test_parked_run_holds_nothing_and_resumes_on_the_decision(acme, acme_api, worker):
    run_id = start(acme_api, how="approval")
    approval = pending_approval(acme_api, run_id)
    run = status_of(acme_api, run_id, "waiting")
    assert run["waiting_reason"] == "approval: Ship it?"
    with tenant_context(acme):
        parked = Run.objects.get(id=run_id)
        assert (parked.lease_owner, parked.lease_expires_at) == ("", None)
    assert not ReadyRun.objects.filter(run_id=run_id).exists()
    assert approval["request"]["artifact"] == {"plan": "v1"}

    decided = acme_api.post(f"/api/v1/approvals/{approval['id']}/decide",
                            {"decision": "approve", "comment": "go", "decided_by": "maria"},
                            # decided_by is not accepted: who decides is who authenticated
                            format="json")
    assert decided.status_code == 200 and decided.json()["status"] == "approved"
    done = status_of(acme_api, run_id, "succeeded")
    assert done["result"]["approved"] is True and done["result"]["by"] == "api:default"
    events = acme_api.get(f"/api/v1/runs/{run_id}/events").json()["results"]
    decision = next(e for e in events if e["kind"] == "approval_decided")
    assert decision["data"]["by"] == "api:default" and decision["data"]["comment"] == "go"

    again = acme_api.post(f"/api/v1/approvals/{approval['id']}/decide", {"decision": "reject"},
                          format="json")
    assert again.status_code == 409 and again.json()["error"]["code"] == "approval_closed"
    assert status_of(acme_api, run_id, "succeeded")["result"]["approved"] is True


def test_approve_with_an_edited_artifact_and_reject(acme_api, worker):
    edited = start(acme_api, how="approval")
    approval = pending_approval(acme_api, edited)
    acme_api.post(f"/api/v1/approvals/{approval['id']}/decide",
                  {"decision": "approve", "artifact": {"plan": "v2"}}, format="json")
    assert status_of(acme_api, edited, "succeeded")["result"]["artifact"] == {"plan": "v2"}

    rejected = start(acme_api, how="approval")
    approval = pending_approval(acme_api, rejected)
    acme_api.post(f"/api/v1/approvals/{approval['id']}/decide", {"decision": "reject"},
                  format="json")
    result = status_of(acme_api, rejected, "succeeded")["result"]
    assert result["approved"] is False and result["by"].startswith("api:")


def test_only_named_deciders_may_decide(acme, acme_api, worker):
    cfo = api_client(api_key_create(tenant=acme, name="cfo")[1])
    run_id = start(acme_api, how="approval", deciders=["api:cfo"])
    approval = pending_approval(acme_api, run_id)
    refused = acme_api.post(f"/api/v1/approvals/{approval['id']}/decide",
                            {"decision": "approve", "decided_by": "api:cfo"}, format="json")
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "not_a_decider"
    assert cfo.post(f"/api/v1/approvals/{approval['id']}/decide", {"decision": "approve"},
                    format="json").status_code == 200
    assert status_of(acme_api, run_id, "succeeded")["result"]["by"] == "api:cfo"


def test_another_tenants_approval_is_404_and_unchanged(acme_api, globex_api, worker):
    run_id = start(acme_api, how="approval")
    approval = pending_approval(acme_api, run_id)
    for response in (globex_api.get(f"/api/v1/approvals/{approval['id']}"),
                     globex_api.post(f"/api/v1/approvals/{approval['id']}/decide",
                                     {"decision": "approve"}, format="json")):
        assert response.status_code == 404
    assert approval["id"] not in globex_api.get("/api/v1/approvals").content.decode()
    assert acme_api.get(f"/api/v1/approvals/{approval['id']}").json()["status"] == "pending"
    acme_api.post(f"/api/v1/runs/{run_id}/cancel")


def test_deciding_a_cancelled_run_changes_nothing(acme_api, worker):
    run_id = start(acme_api, how="approval")
    approval = pending_approval(acme_api, run_id)
    assert acme_api.post(f"/api/v1/runs/{run_id}/cancel").json()["status"] == "cancelled"
    response = acme_api.post(f"/api/v1/approvals/{approval['id']}/decide",
                             {"decision": "approve"}, format="json")
    assert response.status_code == 409
    assert acme_api.get(f"/api/v1/runs/{run_id}").json()["status"] == "cancelled"


def test_expiry_takes_the_timeout_path_and_a_late_decision_is_refused(acme_api, worker):
    run_id = start(acme_api, how="approval", timeout=1)
    approval = pending_approval(acme_api, run_id)
    done = status_of(acme_api, run_id, "succeeded", timeout=30)
    assert done["result"] == {"timed_out": {"waiting_for": "approval"}}
    late = acme_api.post(f"/api/v1/approvals/{approval['id']}/decide", {"decision": "approve"},
                         format="json")
    assert late.status_code == 409
    assert acme_api.get(f"/api/v1/approvals/{approval['id']}").json()["status"] == "expired"


def test_event_arriving_while_the_run_reaches_its_wait_is_not_lost(acme, acme_api, worker):
    key = f"mailbox-{uuid.uuid4()}@acme.test"
    run_id = start(acme_api, how="event", kind="mail.received", key=key)
    early = acme_api.post("/api/v1/events", {"kind": "mail.received", "key": key,  # or after
                                             "payload": {"historyId": 7}}, format="json")
    assert early.status_code == 202  # the run may not have parked yet: kept, then matched
    assert status_of(acme_api, run_id, "succeeded")["result"] == {"historyId": 7}


def test_event_wakes_a_parked_run_once_even_if_delivered_twice(acme, acme_api, worker):
    key = f"doc-{uuid.uuid4()}"
    run_id = start(acme_api, how="event", kind="docs.signed", key=key)
    status_of(acme_api, run_id, "waiting")
    body = {"kind": "docs.signed", "key": key, "payload": {"signed": True}, "id": key}
    first = acme_api.post("/api/v1/events", body, format="json").json()
    again = acme_api.post("/api/v1/events", body, format="json")
    assert first["resumed"] == [run_id]
    assert again.status_code == 200 and again.json()["duplicate"] is True
    assert status_of(acme_api, run_id, "succeeded")["result"] == {"signed": True}
    with tenant_context(acme):
        assert RunEvent.objects.filter(run_id=run_id, kind="event_received").count() == 1
        assert InboundEvent.objects.filter(source_id=key).count() == 1


def test_event_matching_no_gate_is_recorded_and_answered_normally(acme, acme_api):
    response = acme_api.post("/api/v1/events", {"kind": "misc", "key": "nobody-waits"},
                             format="json")
    assert response.status_code == 202 and response.json()["resumed"] == []
    with tenant_context(acme):
        assert InboundEvent.objects.filter(kind="misc", key="nobody-waits").exists()


def test_gate_timeout_path_is_taken_when_nothing_arrives(acme, acme_api, worker):
    run_id = start(acme_api, how="event", kind="hardware", key=str(uuid.uuid4()), timeout=1)
    assert status_of(acme_api, run_id, "succeeded")["result"] == {
        "timed_out": {"waiting_for": "event"}}
    with tenant_context(acme):
        assert EventGate.objects.get(run_id=run_id).status == "expired"
    assert not Wakeup.objects.filter(run_id=run_id).exists()


def test_durable_sleep_wakes_through_beat(acme_api, worker):
    run_id = start(acme_api, how="sleep", seconds=1)
    status_of(acme_api, run_id, "waiting")
    assert Wakeup.objects.filter(run_id=run_id).exists()
    assert status_of(acme_api, run_id, "succeeded")["result"] == "rested"


def test_child_run_result_reaches_the_parent(acme, acme_api, worker):
    run_id = start(acme_api, how="child")
    done = status_of(acme_api, run_id, "succeeded", timeout=60)
    assert done["result"]["status"] == "succeeded"
    assert done["result"]["result"]["findings"] == 2
    with tenant_context(acme):
        child = Run.objects.get(parent_id=run_id)
        assert str(child.id) == done["result"]["run"]


def test_parked_run_survives_a_restart_of_every_worker_and_beat(
        acme, acme_api, worker, beat, start_worker):
    run_id = start(acme_api, how="approval")
    approval = pending_approval(acme_api, run_id)
    status_of(acme_api, run_id, "waiting")
    worker.stop()
    beat.stop()
    acme_api.post(f"/api/v1/approvals/{approval['id']}/decide", {"decision": "approve"},
                  format="json")
    beat.ensure()
    start_worker("after-restart")
    assert status_of(acme_api, run_id, "succeeded", timeout=60)["result"]["approved"] is True
    with tenant_context(acme):
        assert Approval.objects.get(id=approval["id"]).status == "approved"
