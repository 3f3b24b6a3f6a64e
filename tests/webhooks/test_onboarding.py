"""The onboarding demo, driven by real workers through the API and a Slack button, sending
real email to a local SMTP server: each email exactly once, even across a kill -9."""

import uuid

import pytest
from django.test import Client
from django_tenants.utils import tenant_context

from integrations.services import credential_set
from integrations.webhooks.services import slack_connection_create
from runs.agents import registry
from runs.effects.models import Effect
from runs.models import Run
from tests.support.api import pending_approval, status_of
from tests.support.fakes.fixtures import smtp_server  # noqa: F401
from tests.support.waiting import wait_for
from tests.webhooks.slack import click_body, signed_headers


def start(api, email, **extra):
    response = api.post("/api/v1/runs", {"agent": "onboarding", "input": {
        "employee": {"name": "Ada", "email": email}, "it_email": "it@acme.test",
        "start_date": "2030-01-07", **extra}}, format="json")
    assert response.status_code == 201, response.content
    return response.json()["id"]


def event(api, kind, key):
    response = api.post("/api/v1/events", {"kind": kind, "key": key}, format="json")
    assert response.status_code == 202, response.content


@pytest.fixture
def mail(acme, smtp_server):  # noqa: F811
    with tenant_context(acme):
        credential_set(connector="email", secrets={"host": "127.0.0.1",
                                                   "port": smtp_server.port})
    return smtp_server


def emails(tenant, run_id, server):
    """The run's email effects, each checked against what the SMTP server received."""
    with tenant_context(tenant):
        effects = list(Effect.objects.filter(run_id=run_id, connector="email", status="done"))
    for effect in effects:
        received = [m for m in server.messages if effect.idempotency_key in
                    (m.get("X-Idempotency-Key") or "")]
        assert len(received) == 1, (effect.name, len(received))
    return sorted(e.name for e in effects)


def test_topologies_check_out():
    for name in ("onboarding", "it_provisioning"):
        registry.get(name).check()


def test_onboarding_runs_to_completion_with_a_slack_approval(acme, acme_api, worker, mail):
    email = f"ada-{uuid.uuid4().hex[:6]}@acme.test"
    run_id = start(acme_api, email)
    assert status_of(acme_api, run_id, "waiting")["waiting_reason"] == f"event docs.signed:{email}"
    event(acme_api, "docs.signed", email)
    approval = pending_approval(acme_api, run_id)
    assert approval["request"]["title"] == "Day-one schedule for Ada"
    assert approval["request"]["artifact"]["date"] == "2030-01-07"

    secret = uuid.uuid4().hex
    slack = slack_connection_create(tenant=acme, team_id=f"T{uuid.uuid4().hex[:10].upper()}",
                                    signing_secret=secret)
    body = click_body(slack.team_id, approval["id"], user="U0MANAGER")
    assert Client().post(f"/webhooks/slack/{slack.id}/interactivity", body,
                         content_type="application/x-www-form-urlencoded",
                         **signed_headers(secret, body)).status_code == 200
    wait_for(lambda: acme_api.get(f"/api/v1/runs/{run_id}").json()["waiting_reason"]
             == f"event hardware.delivered:{email}", what="the hardware wait")
    event(acme_api, "hardware.delivered", email)
    result = status_of(acme_api, run_id, "succeeded")["result"]
    assert result["hardware"] == "delivered" and result["escalated"] is False
    assert result["accounts"]["hardware_order"].startswith("HW-")
    assert emails(acme, run_id, mail) == ["day_one_schedule", "welcome_packet"]


def test_hardware_timeout_escalates_once_then_day_one_goes_ahead(acme, acme_api, worker, mail):
    email = f"ada-{uuid.uuid4().hex[:6]}@acme.test"
    run_id = start(acme_api, email, hardware_timeout_seconds=1)
    event(acme_api, "docs.signed", email)  # may arrive before the run parks: kept, not lost
    approval = pending_approval(acme_api, run_id)
    acme_api.post(f"/api/v1/approvals/{approval['id']}/decide", {"decision": "approve"},
                  format="json")
    result = status_of(acme_api, run_id, "succeeded", timeout=60)["result"]
    assert result == {**result, "hardware": "loaner", "escalated": True}
    assert emails(acme, run_id, mail) == [
        "day_one_schedule", "hardware_escalation", "welcome_packet"]


def test_a_rejected_schedule_is_revised_and_asked_again(acme, acme_api, worker, mail):
    email = f"ada-{uuid.uuid4().hex[:6]}@acme.test"
    run_id = start(acme_api, email)
    event(acme_api, "docs.signed", email)
    first = pending_approval(acme_api, run_id)
    acme_api.post(f"/api/v1/approvals/{first['id']}/decide", {"decision": "reject"}, format="json")
    second = wait_for(lambda: [a for a in acme_api.get(
        f"/api/v1/approvals?status=pending&run={run_id}").json()["results"]
        if a["id"] != first["id"]], what="the revised schedule")[0]
    assert second["request"]["artifact"]["revision"] == 2
    acme_api.post(f"/api/v1/runs/{run_id}/cancel")


def test_onboarding_sends_each_email_once_across_a_kill_9(acme, acme_api, worker, start_worker,
                                                           mail):
    workers = [worker, start_worker("onboarding-b")]
    email = f"ada-{uuid.uuid4().hex[:6]}@acme.test"
    mail.inbox.hold_seconds = 5  # the welcome packet is accepted; its 250 comes late
    run_id = start(acme_api, email)
    wait_for(lambda: len(mail.messages) == 1, timeout=30, what="the welcome packet to arrive")
    with tenant_context(acme):
        owner = Run.objects.get(id=run_id).lease_owner
    pid = int(owner.rsplit(":", 1)[1])
    next(w for w in workers if pid in w.pids()).kill()  # mid-send
    mail.inbox.hold_seconds = 0
    unknown = wait_for(lambda: [a for a in acme_api.get(
        f"/api/v1/approvals?status=pending&run={run_id}").json()["results"]
        if a["kind"] == "effect_outcome"], timeout=60, what="'did it go out?' in the inbox")[0]
    assert unknown["request"]["effect"] == "welcome_packet"
    acme_api.post(f"/api/v1/approvals/{unknown['id']}/decide",
                  {"decision": "approve", "comment": "I see it in their inbox"}, format="json")
    event(acme_api, "docs.signed", email)
    approval = wait_for(lambda: [a for a in acme_api.get(
        f"/api/v1/approvals?status=pending&run={run_id}").json()["results"]
        if a["kind"] == "approval"], timeout=60, what="the schedule approval")[0]
    acme_api.post(f"/api/v1/approvals/{approval['id']}/decide", {"decision": "approve"},
                  format="json")
    wait_for(lambda: acme_api.get(f"/api/v1/runs/{run_id}").json()["waiting_reason"]
             == f"event hardware.delivered:{email}", timeout=60, what="the hardware wait")
    event(acme_api, "hardware.delivered", email)
    status_of(acme_api, run_id, "succeeded", timeout=60)
    assert emails(acme, run_id, mail) == ["day_one_schedule", "welcome_packet"]
    assert len([m for m in mail.messages if m["To"] == email]) == 2
