"""The Slack approval message: Block Kit built from the approval alone; sent via the outbox."""

import json
import uuid
from datetime import UTC, datetime
from types import SimpleNamespace

from django.test import Client
from django_tenants.utils import tenant_context

from integrations.services import credential_set
from integrations.webhooks.services import slack_connection_create
from integrations.webhooks.slack_approvals import approval_message_build
from runs.effects.models import OutboxMessage
from tests.support.api import status_of
from tests.support.fakes.fixtures import fake_slack  # noqa: F401
from tests.support.waiting import wait_for
from tests.webhooks.slack import click_body, signed_headers


def approval(**request):
    return SimpleNamespace(id=uuid.uuid4(), run_id=uuid.uuid4(), deciders=["U0MARIA"],
                           expires_at=datetime(2030, 1, 2, 9, 30, tzinfo=UTC),
                           request={"title": "Day-one schedule for Ada", "body": "Please check.",
                                    "artifact": {"09:00": "Welcome"}, **request})


def test_message_has_title_artifact_and_buttons_carrying_the_approval_id():
    pending = approval()
    message = approval_message_build(approval=pending, channel="C0APPROVALS")
    assert message["channel"] == "C0APPROVALS"
    assert message["text"] == "Approval requested: Day-one schedule for Ada"
    section, artifact, context, actions = message["blocks"]
    assert "*Day-one schedule for Ada*" in section["text"]["text"]
    assert '"09:00": "Welcome"' in artifact["text"]["text"]
    assert "U0MARIA" in context["elements"][0]["text"] and "2030-01-02 09:30" in \
        context["elements"][0]["text"]
    buttons = {b["action_id"]: b for b in actions["elements"]}
    assert set(buttons) == {"approve", "reject"}
    assert {b["value"] for b in buttons.values()} == {str(pending.id)}
    assert buttons["approve"]["style"] == "primary" and buttons["reject"]["style"] == "danger"


def test_large_artifacts_are_cut_to_fit_a_section():
    message = approval_message_build(approval=approval(artifact="x" * 10_000), channel="C1")
    assert len(message["blocks"][1]["text"]["text"]) <= 3000


def test_parked_approval_goes_to_slack_through_the_outbox_and_a_click_decides_it(
        acme, acme_api, worker, fake_slack):  # noqa: F811

    secret = uuid.uuid4().hex
    slack = slack_connection_create(tenant=acme, team_id=f"T{uuid.uuid4().hex[:10].upper()}",
                                    signing_secret=secret, approvals_channel="C0APPROVALS")
    try:
        with tenant_context(acme):
            credential_set(connector="slack", secrets={"token": "xoxb-test",
                                                       "api_url": f"{fake_slack.url}/api"})
        run_id = acme_api.post("/api/v1/runs", {"agent": "waiter", "input": {"how": "approval"}},
                               format="json").json()["id"]
        posted = wait_for(lambda: list(fake_slack.messages.get("C0APPROVALS", [])), timeout=30,
                          what="the approval message in Slack")
        assert len(posted) == 1
        with tenant_context(acme):  # Slack has it; the deliverer records it a moment later
            message = wait_for(lambda: OutboxMessage.objects.filter(
                run_id=run_id, status="delivered").first(), timeout=30, what="delivered")
            assert message.connector == "slack"
        approval_id = acme_api.get(f"/api/v1/approvals?run={run_id}").json()["results"][0]["id"]
        assert approval_id in json.dumps(posted[0])
        body = click_body(slack.team_id, approval_id, user="U0BOSS")
        assert Client().post(f"/webhooks/slack/{slack.id}/interactivity", body,
                             content_type="application/x-www-form-urlencoded",
                             **signed_headers(secret, body)).status_code == 200
        result = status_of(acme_api, run_id, "succeeded")["result"]
        assert result["approved"] is True and result["by"] == "slack:U0BOSS"
    finally:
        slack.delete()
