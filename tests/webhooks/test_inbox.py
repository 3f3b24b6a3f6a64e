"""The webhook inbox: a Slack event, a Slack button decision or a Gmail push is a row before the
sender gets its 200, delivered from that row once (in the request, else by the sweep), whatever
happens to the broker or to the delivering transaction."""

import json
import uuid
from datetime import timedelta
from urllib.parse import urlencode

import pytest
import redis
from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models.functions import Now
from django.utils import timezone
from django_tenants.utils import tenant_context

from integrations.webhooks.models import InboxItem, SlackEventSeen
from integrations.webhooks.services import inbox_deliver, inbox_prune
from runs.approvals.models import Approval, InboundEvent
from runs.models import RunEvent
from tests.conftest import Worker
from tests.support.api import pending_approval, start, status_of
from tests.support.waiting import wait_for
from tests.webhooks.slack import click_body, event_body
from tests.webhooks.test_slack import acme_slack, click, post_event  # noqa: F401


def broker_flush():
    """Lose every message in this slot's broker db (a Redis restart without persistence)."""
    redis.Redis.from_url(settings.CELERY_BROKER_URL).flushdb()


class Workers:
    """The session's workers, stopped so nobody consumes the queue (an accepted delivery's
    doorbell waits in the broker), then started again (also if the test failed midway)."""

    def __init__(self, session_workers):
        self.session_workers = session_workers

    def stop(self):
        for process in self.session_workers:
            process.stop()

    def start(self):
        if self.session_workers[-1].process.poll() is not None:
            name = f"session-worker-{len(self.session_workers)}"
            self.session_workers.append(Worker(name, concurrency=2).wait_ready())


@pytest.fixture
def workers(worker, _session_worker):
    held = Workers(_session_worker)
    yield held
    held.start()


def item(acme, source_id) -> InboxItem:
    return InboxItem.objects.get(tenant=acme, source_id=source_id)


def test_an_event_is_delivered_before_the_200_and_its_run_survives_a_broker_flush(
        acme, acme_api, acme_slack, workers):  # noqa: F811
    channel = f"C{uuid.uuid4().hex[:9].upper()}"
    run_id = start(acme_api, how="event", kind="slack.message", key=channel)
    status_of(acme_api, run_id, "waiting")
    workers.stop()
    event_id = f"Ev{uuid.uuid4().hex}"
    body = event_body(acme_slack.team_id, {"type": "message", "channel": channel, "text": "hi"},
                      event_id)
    assert post_event(acme_slack, body).status_code == 200
    stored = item(acme, f"slack:{event_id}")
    assert (stored.kind, stored.status, stored.outcome, stored.payload["text"]) == (
        "slack_event", "delivered", "resumed 1", "hi")
    broker_flush()  # the run's task is gone; the queued run and its ready row are not
    workers.start()  # the watchdog sends it again
    assert status_of(acme_api, run_id, "succeeded")["result"]["text"] == "hi"
    with tenant_context(acme):
        assert RunEvent.objects.filter(run_id=run_id, kind="event_received").count() == 1


def test_a_delivery_that_fails_is_retried_and_delivered_once(acme, acme_api, acme_slack,  # noqa: F811
                                                             worker):
    channel = f"C{uuid.uuid4().hex[:9].upper()}"
    run_id = start(acme_api, how="event", kind="slack.message", key=channel)
    status_of(acme_api, run_id, "waiting")
    event_id = f"Ev{uuid.uuid4().hex}"
    fault = f"inbox_fault_{uuid.uuid4().hex[:8]}"
    # A real PostgreSQL error, once: the sequence is not rolled back with the failed attempt.
    with connection.cursor() as cursor:
        cursor.execute(f"""
            CREATE SEQUENCE acme.{fault};
            CREATE FUNCTION acme.{fault}() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF nextval('acme.{fault}') = 1 THEN
                    RAISE EXCEPTION 'injected deadlock' USING ERRCODE = 'deadlock_detected';
                END IF;
                RETURN NEW;
            END $$;
            CREATE TRIGGER {fault} BEFORE INSERT ON acme.approvals_inboundevent FOR EACH ROW
                WHEN (NEW.source_id = 'slack:{event_id}') EXECUTE FUNCTION acme.{fault}();
        """)
    try:
        body = event_body(acme_slack.team_id, {"type": "message", "channel": channel,
                                               "text": "again"}, event_id)
        assert post_event(acme_slack, body).status_code == 200
        assert status_of(acme_api, run_id, "succeeded")["result"]["text"] == "again"
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP TRIGGER IF EXISTS {fault} ON acme.approvals_inboundevent; "
                           f"DROP FUNCTION IF EXISTS acme.{fault}(); "
                           f"DROP SEQUENCE IF EXISTS acme.{fault}")
    delivered = item(acme, f"slack:{event_id}")
    assert (delivered.status, delivered.attempts) == ("delivered", 2)
    assert "injected deadlock" in delivered.last_error
    with tenant_context(acme):
        assert RunEvent.objects.filter(run_id=run_id, kind="event_received").count() == 1
        assert InboundEvent.objects.filter(source_id=f"slack:{event_id}").count() == 1


def test_a_replayed_event_is_stored_and_delivered_once(acme, acme_api, acme_slack,  # noqa: F811
                                                       worker):
    channel = f"C{uuid.uuid4().hex[:9].upper()}"
    run_id = start(acme_api, how="event", kind="slack.message", key=channel)
    status_of(acme_api, run_id, "waiting")
    event_id = f"Ev{uuid.uuid4().hex}"
    body = event_body(acme_slack.team_id, {"type": "message", "channel": channel}, event_id)
    for _ in range(3):
        assert post_event(acme_slack, body).status_code == 200
    status_of(acme_api, run_id, "succeeded")
    assert post_event(acme_slack, body).status_code == 200  # after delivery, too
    assert InboxItem.objects.filter(tenant=acme, source_id=f"slack:{event_id}").count() == 1
    with tenant_context(acme):
        assert RunEvent.objects.filter(run_id=run_id, kind="event_received").count() == 1


def test_a_decision_click_survives_a_broker_flush(acme, acme_api, acme_slack,  # noqa: F811
                                                  workers):
    run_id = start(acme_api, how="approval")
    approval = pending_approval(acme_api, run_id)
    status_of(acme_api, run_id, "waiting")
    workers.stop()
    assert click(acme_slack, click_body(acme_slack.team_id, approval["id"])).status_code == 200
    stored = InboxItem.objects.get(tenant=acme, kind="slack_decision",
                                   payload__approval_id=approval["id"])
    assert stored.payload == {"approval_id": approval["id"], "approve": True,
                              "by": "slack:U0MARIA"}
    broker_flush()
    workers.start()
    result = status_of(acme_api, run_id, "succeeded")["result"]
    assert result["approved"] is True and result["by"] == "slack:U0MARIA"
    assert InboxItem.objects.get(id=stored.id).outcome == "approved"


def test_a_resent_click_is_one_decision_and_a_stale_one_is_a_recorded_refusal(
        acme, acme_api, acme_slack, worker):  # noqa: F811
    run_id = start(acme_api, how="approval")
    approval = pending_approval(acme_api, run_id)
    status_of(acme_api, run_id, "waiting")
    body = click_body(acme_slack.team_id, approval["id"], action="reject")
    assert click(acme_slack, body).status_code == 200
    assert click(acme_slack, body).status_code == 200  # Slack sent the same click again
    status_of(acme_api, run_id, "succeeded")
    decisions = InboxItem.objects.filter(tenant=acme, kind="slack_decision",
                                         payload__approval_id=approval["id"])
    assert [d.outcome for d in decisions] == ["rejected"]
    late = click(acme_slack, click_body(acme_slack.team_id, approval["id"], action="approve"))
    assert late.status_code == 200
    refused = wait_for(lambda: decisions.filter(outcome="approval_closed").first(),
                       what="the late click to be refused")
    assert (refused.status, refused.attempts, refused.last_error) == ("delivered", 1, "")
    with tenant_context(acme):
        assert Approval.objects.get(id=approval["id"]).status == "rejected"


@pytest.mark.parametrize("kind", ["slack_event", "slack_decision", "gmail_push"])
def test_inbox_rows_keep_to_their_kinds_and_statuses(acme, kind):
    row = InboxItem.objects.create(tenant=acme, kind=kind, source_id=f"test:{uuid.uuid4()}",
                                   payload={},  # not due: the sweep leaves it alone
                                   next_attempt_at=timezone.now() + timedelta(days=1))
    with pytest.raises(IntegrityError), transaction.atomic():
        InboxItem.objects.filter(id=row.id).update(status="delivered")  # without delivered_at
    with pytest.raises(IntegrityError), transaction.atomic():
        InboxItem.objects.filter(id=row.id).update(kind="carrier_pigeon")
    row.delete()


@pytest.mark.parametrize("event", [
    {"type": "message", "metadata": "x"},
    {"type": "message", "metadata": {"event_payload": ["x"]}},
    {"type": "reaction_added", "item": "x"},
], ids=["metadata", "event_payload", "item"])
def test_an_event_of_the_wrong_shape_is_refused_and_never_stored(acme, acme_slack,  # noqa: F811
                                                                 event):
    event_id = f"Ev{uuid.uuid4().hex}"
    response = post_event(acme_slack, event_body(acme_slack.team_id, event, event_id))
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "malformed_body"
    assert not InboxItem.objects.filter(tenant=acme, source_id=f"slack:{event_id}").exists()
    assert not SlackEventSeen.objects.filter(connection=acme_slack, event_id=event_id).exists()


def test_an_overlong_event_id_and_a_click_with_a_bare_action_are_refused(acme, acme_slack):  # noqa: F811
    too_long = "Ev" + "x" * 63
    response = post_event(acme_slack, event_body(acme_slack.team_id, {"type": "message"},
                                                 too_long))
    assert (response.status_code, response.json()["error"]["code"]) == (400, "malformed_body")
    bare = {"type": "block_actions", "team": {"id": acme_slack.team_id}, "user": {"id": "U1"},
            "actions": ["approve"]}
    response = click(acme_slack, urlencode({"payload": json.dumps(bare)}).encode())
    assert (response.status_code, response.json()["error"]["code"]) == (400, "malformed_body")
    assert not InboxItem.objects.filter(tenant=acme, source_id=f"slack:{too_long}").exists()
    assert not InboxItem.objects.filter(tenant=acme, payload__by="slack:U1").exists()


def test_an_item_that_keeps_failing_is_given_up_on_and_pruned(acme, worker):
    # Stored before its shape was checked (an older release): delivering it always raises.
    poison = InboxItem.objects.create(
        tenant=acme, kind="gmail_push", source_id=f"gmail:{uuid.uuid4()}", payload={},
        attempts=settings.WEBHOOK_INBOX_MAX_ATTEMPTS - 1)
    failed = wait_for(lambda: InboxItem.objects.filter(id=poison.id, status="failed").first(),
                      what="the sweep to give up on the poison item")
    assert failed.attempts == settings.WEBHOOK_INBOX_MAX_ATTEMPTS
    assert failed.outcome == "KeyError: 'mailbox'" and failed.last_error == failed.outcome
    assert failed.delivered_at is None
    assert inbox_prune()["inbox_items"] == 0  # kept as long as a delivered item would be
    later = timezone.now() + timedelta(seconds=settings.EVENT_DEDUPE_RETENTION_SECONDS + 60)
    inbox_prune(now=later)
    assert not InboxItem.objects.filter(id=poison.id).exists()


def test_a_click_before_the_expiry_delivered_after_it_still_decides(
        acme, acme_api, acme_slack, workers):  # noqa: F811
    run_id = start(acme_api, how="approval")
    approval = pending_approval(acme_api, run_id)
    status_of(acme_api, run_id, "waiting")
    workers.stop()  # nothing delivers the item but this test
    # Accepted before the expiry, its delivery in the request failed (the sweep delivers it).
    stored = InboxItem.objects.create(
        tenant=acme, kind="slack_decision", source_id=f"slack-decision:{approval['id']}:U0MARIA:1",
        payload={"approval_id": approval["id"], "approve": True, "by": "slack:U0MARIA"},
        attempts=1)
    with tenant_context(acme):  # it expires after Slack got its 200, before the delivery
        Approval.objects.filter(id=approval["id"]).update(expires_at=Now())
    assert inbox_deliver(item_id=stored.id) == "approved"
    workers.start()
    result = status_of(acme_api, run_id, "succeeded")["result"]
    assert result["approved"] is True and result["by"] == "slack:U0MARIA"
