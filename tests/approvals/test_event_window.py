"""Old events do not wake new waits: a gate matches events received since its wait began (or
since an explicit `since`), an unmatched event expires after EVENT_BUFFER_SECONDS, and the
retention job prunes the dedupe rows."""

import uuid
from datetime import timedelta
from uuid import UUID

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from django_tenants.utils import tenant_context

from integrations.webhooks.models import GmailMessageSeen, InboxItem, SlackEventSeen
from integrations.webhooks.services import gmail_connection_create, slack_connection_create
from runs.approvals.models import EventGate, InboundEvent
from runs.approvals.services import event_deliver, gate_open
from runs.models import Checkpoint, Run
from runs.retention.tasks import archive_all_tenants
from tests.support.api import start, status_of
from tests.support.waiting import wait_for


def post_event(api, kind, key, payload):
    response = api.post("/api/v1/events", {"kind": kind, "key": key, "payload": payload},
                        format="json")
    assert response.status_code == 202, response.content
    return response.json()


def gate_of(acme, run_id):
    with tenant_context(acme):
        return wait_for(lambda: EventGate.objects.filter(run_id=run_id, status="open").first(),
                        what="the run's open gate")


def test_an_event_from_before_the_wait_does_not_wake_it(acme, acme_api, worker):
    key = f"order-{uuid.uuid4()}"
    post_event(acme_api, "hardware.delivered", key, {"n": 1})  # last month's delivery
    run_id = start(acme_api, how="event", kind="hardware.delivered", key=key)
    assert status_of(acme_api, run_id, "waiting")["waiting_reason"] == \
        f"event hardware.delivered:{key}"
    gate_of(acme, run_id)
    assert post_event(acme_api, "hardware.delivered", key, {"n": 2})["resumed"] == [run_id]
    assert status_of(acme_api, run_id, "succeeded")["result"] == {"n": 2}


def test_since_reaches_back_to_an_earlier_event(acme, acme_api, worker):
    key = f"order-{uuid.uuid4()}"
    before = timezone.now()
    post_event(acme_api, "hardware.delivered", key, {"n": 1})
    run_id = start(acme_api, how="event", kind="hardware.delivered", key=key,
                   since=before.isoformat())
    assert status_of(acme_api, run_id, "succeeded")["result"] == {"n": 1}


def test_a_buffered_event_expires(acme, acme_api, worker):
    key = f"order-{uuid.uuid4()}"
    post_event(acme_api, "hardware.delivered", key, {"n": 1})
    expired = timezone.now() - timedelta(seconds=settings.EVENT_BUFFER_SECONDS + 60)
    with tenant_context(acme):
        InboundEvent.objects.filter(key=key).update(received_at=expired)
    run_id = start(acme_api, how="event", kind="hardware.delivered", key=key,
                   since=(expired - timedelta(hours=1)).isoformat())
    gate_of(acme, run_id)  # parked: the expired event did not count
    assert post_event(acme_api, "hardware.delivered", key, {"n": 2})["resumed"] == [run_id]
    assert status_of(acme_api, run_id, "succeeded")["result"] == {"n": 2}


def test_an_event_accepted_before_the_wait_but_delivered_after_does_not_wake_it(
        acme, acme_api, worker):
    key = f"C{uuid.uuid4().hex[:9]}"
    run_id = start(acme_api, how="event", kind="slack.message", key=key)
    gate = gate_of(acme, run_id)
    with tenant_context(acme):
        late = event_deliver(kind="slack.message", key=key, payload={"n": 1},
                             source_id=f"slack:{uuid.uuid4()}",
                             received_at=gate.since - timedelta(minutes=5))  # a slow retry
        assert late.resumed == []
        # delivered as the webhook inbox does: slack.* cannot come from POST /events
        on_time = event_deliver(kind="slack.message", key=key, payload={"n": 2},
                                source_id=f"slack:{uuid.uuid4()}")
        assert [str(resumed) for resumed in on_time.resumed] == [run_id]
    assert status_of(acme_api, run_id, "succeeded")["result"] == {"n": 2}


def test_the_retention_job_prunes_old_dedupe_rows_and_keeps_pending_inbox_items(
        acme, acme_api, worker):
    old = timezone.now() - timedelta(seconds=settings.EVENT_DEDUPE_RETENTION_SECONDS + 60)
    slack = slack_connection_create(tenant=acme, team_id=f"T{uuid.uuid4().hex[:10].upper()}",
                                    signing_secret="s")
    gmail = gmail_connection_create(tenant=acme, email=f"{uuid.uuid4().hex[:8]}@acme.test",
                                    audience="a", service_account_email="p@acme.test")
    tag = uuid.uuid4().hex
    for age, name in ((old, "old"), (timezone.now(), "new")):
        seen = SlackEventSeen.objects.create(connection=slack, event_id=f"{name}-{tag}")
        SlackEventSeen.objects.filter(id=seen.id).update(received_at=age)
        seen = GmailMessageSeen.objects.create(connection=gmail, message_id=f"{name}-{tag}")
        GmailMessageSeen.objects.filter(id=seen.id).update(received_at=age)
        InboxItem.objects.create(tenant=acme, kind="slack_event", source_id=f"{name}-{tag}",
                                 payload={}, status="delivered", delivered_at=age,
                                 received_at=age)
        with tenant_context(acme):
            InboundEvent.objects.create(kind="misc", key=tag, source_id=f"{name}-{tag}",
                                        received_at=age)
    stuck = InboxItem.objects.create(tenant=acme, kind="slack_event", source_id=f"stuck-{tag}",
                                     payload={}, received_at=old,  # never due: left alone
                                     next_attempt_at=timezone.now() + timedelta(days=1))

    archive_all_tenants()  # what beat runs: public rows here, each tenant's pass in a worker

    assert list(SlackEventSeen.objects.filter(event_id__endswith=tag)
                .values_list("event_id", flat=True)) == [f"new-{tag}"]
    assert list(GmailMessageSeen.objects.filter(message_id__endswith=tag)
                .values_list("message_id", flat=True)) == [f"new-{tag}"]
    assert set(InboxItem.objects.filter(source_id__endswith=tag)
               .values_list("source_id", flat=True)) == {f"new-{tag}", f"stuck-{tag}"}
    with tenant_context(acme):
        wait_for(lambda: not InboundEvent.objects.filter(source_id=f"old-{tag}").exists(),
                 what="acme's retention pass to prune the old inbound event")
        assert InboundEvent.objects.filter(source_id=f"new-{tag}").exists()
    stuck.delete()
    slack.delete()
    gmail.delete()


def test_a_worker_clock_behind_the_database_neither_loses_nor_invents_a_wakeup(
        acme, acme_api, worker, monkeypatch):
    key = f"order-{uuid.uuid4()}"
    run_id = start(acme_api, how="event", kind="hardware.delivered", key=key)
    gate_of(acme, run_id)
    # From here this process is a worker whose clock runs an hour behind the database's,
    # which stamped the run's checkpoints (and so the gate's `since`).
    real_now = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: real_now() - timedelta(hours=1))
    with tenant_context(acme):
        fresh = event_deliver(kind="hardware.delivered", key=key, payload={"n": 1},
                              source_id=f"test:{uuid.uuid4()}")
        assert fresh.resumed == [UUID(run_id)]  # not dated an hour before the wait
    assert status_of(acme_api, run_id, "succeeded")["result"] == {"n": 1}

    with tenant_context(acme):  # a new wait of the same run must not take an older event
        run = Run.objects.get(id=run_id)
        reached = Checkpoint.objects.filter(run_id=run_id).order_by("-visit").first()
        old = event_deliver(kind="hardware.returned", key=key, payload={},
                            received_at=reached.created_at - timedelta(minutes=10))
        with transaction.atomic():
            gate = gate_open(run=run, visit=reached.visit + 1, kind="hardware.returned", key=key,
                             then="done", on_timeout=None, timeout=None)
        assert gate.since == reached.created_at > old.event.received_at
        assert (gate.status, InboundEvent.objects.get(id=old.event.id).consumed_at) == \
            ("open", None)
        gate.delete()
