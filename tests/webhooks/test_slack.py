"""Slack Events API and interactivity: verified, deduplicated, answered fast; workers resume."""

import json
import logging
import time
import uuid
from urllib.parse import urlencode

import pytest
from django.test import Client
from django_tenants.utils import tenant_context

from integrations.webhooks.models import InboxItem, SlackConnection, SlackEventSeen
from integrations.webhooks.services import slack_connection_create
from runs.approvals.models import Approval, InboundEvent
from runs.models import RunEvent
from tests.support.api import pending_approval, start, status_of
from tests.webhooks.slack import click_body, event_body, signed_headers

SECRET = "8f742231b10e8888abcd99yyyzzz85a5"


@pytest.fixture
def acme_slack(acme):
    return slack_connection_create(tenant=acme, team_id=f"T{uuid.uuid4().hex[:10].upper()}",
                                   signing_secret=SECRET, approvals_channel="C0APPROVALS")


@pytest.fixture
def globex_slack(globex):
    return slack_connection_create(tenant=globex, team_id=f"T{uuid.uuid4().hex[:10].upper()}",
                                   signing_secret="globex-" + SECRET)


def post_event(connection, body, secret=SECRET, **headers):
    return Client().post(f"/webhooks/slack/{connection.id}/events", body,
                         content_type="application/json", **signed_headers(secret, body, **headers))


def test_url_verification_answers_the_challenge(acme_slack):
    body = json.dumps({"token": "x", "challenge": "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7",
                       "type": "url_verification"}).encode()
    response = post_event(acme_slack, body)
    assert response.status_code == 200
    assert response.json() == {"challenge": "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7"}


def test_signing_secret_is_sealed_at_rest(acme_slack):
    stored = bytes(SlackConnection.objects.get(id=acme_slack.id).signing_secret_sealed)
    assert SECRET.encode() not in stored and len(stored) > len(SECRET)


def test_forged_signature_and_stale_timestamps_are_rejected_and_record_nothing(acme_slack):
    event_id = f"Ev{uuid.uuid4().hex}"
    body = event_body(acme_slack.team_id, {"type": "message", "channel": "C1"}, event_id)
    forged = post_event(acme_slack, body, secret="not-the-secret")
    assert forged.status_code == 401 and forged.json()["error"]["code"] == "invalid_signature"
    # replayed from the past, or minted for the future: past the 300 s window by more than the
    # second the header's whole seconds may lose and the request's time under load
    for skew in (-320, 320):
        stale = post_event(acme_slack, body, timestamp=time.time() + skew)
        assert stale.status_code == 401 and stale.json()["error"]["code"] == "stale_timestamp"
    tampered_headers = signed_headers(SECRET, body)
    tampered = Client().post(f"/webhooks/slack/{acme_slack.id}/events", body + b" ",
                             content_type="application/json", **tampered_headers)
    assert tampered.status_code == 401
    unsigned = Client().post(f"/webhooks/slack/{acme_slack.id}/events", body,
                             content_type="application/json")
    assert unsigned.status_code == 401
    assert not SlackEventSeen.objects.filter(event_id=event_id).exists()


def test_a_timestamp_of_hundreds_of_digits_is_refused_not_a_500(acme_slack):
    response = Client(raise_request_exception=False).post(
        f"/webhooks/slack/{acme_slack.id}/events", b"{}", content_type="application/json",
        HTTP_X_SLACK_REQUEST_TIMESTAMP="9" * 400, HTTP_X_SLACK_SIGNATURE="v0=00")
    assert response.status_code == 401, response.content[:200]
    assert response.json()["error"]["code"] == "invalid_timestamp"


@pytest.mark.parametrize("json_text", ["[" * 100_000 + "]" * 100_000,
                                       '{"a":' * 40 + "1" + "}" * 40, '{"type":"x","t":"\\u0000"}',
                                       '{"type":"x","t":"\\ud800"}', '{"type":"x","n":1e400}'],
                         ids=["recursion", "deep", "nul", "surrogate", "infinity"])
def test_a_signed_body_that_cannot_be_stored_is_400_malformed_body(acme_slack, json_text):
    client = Client(raise_request_exception=False)
    body = json_text.encode()
    events = client.post(f"/webhooks/slack/{acme_slack.id}/events", body,
                         content_type="application/json", **signed_headers(SECRET, body))
    form = urlencode({"payload": json_text}).encode()
    clicks = client.post(f"/webhooks/slack/{acme_slack.id}/interactivity", form,
                         content_type="application/x-www-form-urlencoded",
                         **signed_headers(SECRET, form))
    for response in (events, clicks):
        assert response.status_code == 400, response.content[:200]
        assert response.json()["error"]["code"] == "malformed_body"


def test_unknown_connection_is_404_json():
    response = Client().post(f"/webhooks/slack/{uuid.uuid4()}/events", b"{}",
                             content_type="application/json")
    assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"


def test_event_for_another_team_is_refused(acme_slack):
    body = event_body("TSOMEONEELSE", {"type": "message", "channel": "C1"})
    assert post_event(acme_slack, body).status_code == 403


def test_event_resumes_the_parked_run_once_despite_retries_and_replays(acme, acme_api,
                                                                       acme_slack, worker):
    channel = f"C{uuid.uuid4().hex[:9].upper()}"
    run_id = start(acme_api, how="event", kind="slack.message", key=channel)
    status_of(acme_api, run_id, "waiting")
    event_id = f"Ev{uuid.uuid4().hex}"
    body = event_body(acme_slack.team_id, {"type": "message", "channel": channel,
                                           "user": "U1", "text": "signed", "ts": "1.2"}, event_id)
    started = time.monotonic()
    assert post_event(acme_slack, body).status_code == 200
    assert time.monotonic() - started < 3  # Slack's deadline
    retry = post_event(acme_slack, body, HTTP_X_SLACK_RETRY_NUM="1",
                       HTTP_X_SLACK_RETRY_REASON="http_timeout")
    replay = post_event(acme_slack, body)  # same event, freshly signed: still a duplicate
    assert retry.status_code == 200 and replay.status_code == 200
    done = status_of(acme_api, run_id, "succeeded")
    assert done["result"]["text"] == "signed"
    with tenant_context(acme):
        assert RunEvent.objects.filter(run_id=run_id, kind="event_received").count() == 1
        assert InboundEvent.objects.filter(source_id=f"slack:{event_id}").count() == 1
    assert SlackEventSeen.objects.filter(event_id=event_id).count() == 1


def test_thread_reply_and_message_metadata_route_to_their_keys(acme, acme_api, acme_slack,
                                                               worker):
    correlation = f"onboarding-{uuid.uuid4()}"
    run_id = start(acme_api, how="event", kind="slack.message", key=correlation)
    status_of(acme_api, run_id, "waiting")
    event = {"type": "message", "channel": "C1", "thread_ts": "1.1",
             "metadata": {"event_type": "agent", "event_payload": {"correlation_key": correlation}}}
    assert post_event(acme_slack, event_body(acme_slack.team_id, event)).status_code == 200
    status_of(acme_api, run_id, "succeeded")


def click(connection, body, secret=SECRET):
    return Client().post(f"/webhooks/slack/{connection.id}/interactivity", body,
                         content_type="application/x-www-form-urlencoded",
                         **signed_headers(secret, body))


def test_approve_button_decides_the_approval_and_the_run_resumes(acme, acme_api, acme_slack,
                                                                  worker, caplog):
    run_id = start(acme_api, how="approval")
    approval = pending_approval(acme_api, run_id)
    status_of(acme_api, run_id, "waiting")
    assert click(acme_slack, click_body(acme_slack.team_id, approval["id"])).status_code == 200
    result = status_of(acme_api, run_id, "succeeded")["result"]
    assert result["approved"] is True and result["by"] == "slack:U0MARIA"
    with caplog.at_level(logging.WARNING, logger="integrations.webhooks.services"):
        again = click(acme_slack, click_body(acme_slack.team_id, approval["id"], action="reject"))
    assert again.status_code == 200  # answered; the request refuses a second decision
    assert f"approval {approval['id']} in acme by slack:U0MARIA refused: approval_closed" \
        in caplog.text
    refused = InboxItem.objects.get(tenant=acme, kind="slack_decision",
                                    payload__approval_id=approval["id"], payload__approve=False)
    assert (refused.status, refused.outcome) == ("delivered", "approval_closed")
    assert acme_api.get(f"/api/v1/approvals/{approval['id']}").json()["status"] == "approved"


def test_reject_button_with_a_forged_signature_does_nothing(acme_api, acme_slack, worker):
    run_id = start(acme_api, how="approval")
    approval = pending_approval(acme_api, run_id)
    forged = click(acme_slack, click_body(acme_slack.team_id, approval["id"], "reject"),
                   secret="forged")
    assert forged.status_code == 401
    assert acme_api.get(f"/api/v1/approvals/{approval['id']}").json()["status"] == "pending"
    acme_api.post(f"/api/v1/runs/{run_id}/cancel")


def test_click_for_another_tenants_approval_does_nothing(acme, acme_api, globex, globex_slack,
                                                         worker, caplog):
    run_id = start(acme_api, how="approval")
    approval = pending_approval(acme_api, run_id)
    with caplog.at_level(logging.WARNING, logger="integrations.webhooks.services"):
        response = click(globex_slack, click_body(globex_slack.team_id, approval["id"]),
                         secret="globex-" + SECRET)
    assert response.status_code == 200  # Slack gets its answer; globex has no such approval
    assert f"approval {approval['id']} in globex by slack:U0MARIA refused: not_found" \
        in caplog.text
    refused = InboxItem.objects.get(tenant=globex, kind="slack_decision",
                                    payload__approval_id=approval["id"])
    assert (refused.status, refused.outcome) == ("delivered", "not_found")
    with tenant_context(acme):
        assert Approval.objects.get(id=approval["id"]).status == "pending"
    assert acme_api.get(f"/api/v1/runs/{run_id}").json()["status"] == "waiting"
    acme_api.post(f"/api/v1/runs/{run_id}/cancel")


def test_connections_api_never_returns_the_secret(acme_api, globex_api):
    team = f"T{uuid.uuid4().hex[:10].upper()}"
    created = acme_api.post("/api/v1/connections/slack",
                            {"team_id": team, "signing_secret": "s3cr3t-value",
                             "approvals_channel": "C9"}, format="json")
    assert created.status_code == 201, created.content
    assert "s3cr3t-value" not in created.content.decode()
    assert created.json()["events_url"].endswith(f"/webhooks/slack/{created.json()['id']}/events")
    listed = acme_api.get("/api/v1/connections/slack")
    assert "s3cr3t-value" not in listed.content.decode()
    assert team in listed.content.decode() and team not in globex_api.get(
        "/api/v1/connections/slack").content.decode()
    again = acme_api.post("/api/v1/connections/slack",
                          {"team_id": team, "signing_secret": "x"}, format="json")
    assert again.status_code == 409  # one connection per team in a tenant
    # Another tenant claiming the same team id locks nobody out: it gets its own connection,
    # verified with its own secret, reached by its own URL.
    claimed = globex_api.post("/api/v1/connections/slack",
                              {"team_id": team, "signing_secret": "x"}, format="json")
    assert claimed.status_code == 201 and claimed.json()["id"] != created.json()["id"]
    assert globex_api.delete(f"/api/v1/connections/slack/{claimed.json()['id']}").status_code == 204
    assert globex_api.delete(f"/api/v1/connections/slack/{created.json()['id']}").status_code == 404
    assert acme_api.delete(f"/api/v1/connections/slack/{created.json()['id']}").status_code == 204
