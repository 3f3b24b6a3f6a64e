"""The outbox under a lease, and "outcome unknown" only when it is unknown.

A notification is claimed by one deliverer at a time (`sending`, until its claim expires), on a
queue of its own; a deliverer that dies mid-call leaves a claim that expires, after which a
receiver that honours keys gets it again under the same key and one that cannot be asked is
left to a person. In the ledger, an attempt that never reached the receiver and a model call
are simply made again, and a person who says "it was delivered" can give the step its result.
"""

import time
from datetime import timedelta

from django.conf import settings
from django.db import connection
from django.utils import timezone
from django_tenants.utils import tenant_context

from agentplatform.storable import KEPT_MAX_DEPTH, TOO_DEEP_KEPT
from integrations.services import credential_set
from runs.approvals.models import Approval
from runs.dispatch.models import TenantDue
from runs.dispatch.services import due_mark
from runs.effects.models import Effect, OutboxMessage
from runs.models import Run, RunEvent
from runs.services import run_start
from tests.support.fakes.fixtures import fake_openai  # noqa: F401
from tests.support.runs import finished
from tests.support.waiting import wait_for
from tests.tenants.test_admin_console import staff_client


def test_slow_receiver_gets_each_message_once_and_runs_are_not_held_up(
        in_acme, receiver, worker):
    receiver.notify_delay = 3  # every delivery takes 3 s (the old retry came after 0.2 s)
    started = time.monotonic()
    runs = [run_start(agent="herald", input={"url": f"{receiver.base}/notify"}).run.id
            for _ in range(10)]
    wait_for(lambda: Run.objects.filter(id__in=runs, status="succeeded").count() == 10,
             timeout=25, interval=0.2, what="the runs to finish beside 90 s of slow deliveries")
    assert time.monotonic() - started < 25
    in_flight = OutboxMessage.objects.filter(run_id__in=runs).exclude(status="delivered")
    assert in_flight.exists()  # the runs did not wait for their notifications
    wait_for(lambda: OutboxMessage.objects.filter(run_id__in=runs, status="delivered").count()
             == 30, timeout=120, interval=0.5, what="all 30 notifications to be delivered")
    keys = set(OutboxMessage.objects.filter(run_id__in=runs)
               .values_list("idempotency_key", flat=True))
    assert len(keys) == 30
    assert receiver.keys("/notify") == {key: 1 for key in keys}  # each sent exactly once
    assert set(OutboxMessage.objects.filter(run_id__in=runs).values_list("attempts", flat=True)) \
        == {1}


def test_a_delivery_answered_with_what_jsonb_refuses_is_recorded_once(in_acme, receiver, worker):
    """NaN and U+0000 parse in Python and not in jsonb: the answer is recorded as it can be
    (its text, U+FFFD), not left `sending` to be sent again on every claim."""
    receiver.raw_answer = b'{"v": NaN, "t": "a\\u0000b"}'
    run = run_start(agent="herald", input={"url": f"{receiver.base}/notify"}).run
    wait_for(lambda: OutboxMessage.objects.filter(run=run, status="delivered").count() == 3,
             timeout=30, interval=0.2, what="the three notifications to be delivered")
    assert [m.result for m in OutboxMessage.objects.filter(run=run)] == \
        [{"v": "nan", "t": "a\ufffdb"}] * 3
    assert set(receiver.keys("/notify").values()) == {1}


def test_a_delivery_answered_with_json_nested_too_deep_is_recorded_once(in_acme, receiver, worker):
    """Deeper than KEPT_MAX_DEPTH (600 levels parse, but making them storable recursed past the
    interpreter's limit): recorded cut off there, not left `sending` to be sent again. (Deeper
    than json.loads reads, an answer is None: integrations.connectors.transport.)"""
    depth = 600
    receiver.raw_answer = b"[" * depth + b"]" * depth
    run = run_start(agent="herald", input={"url": f"{receiver.base}/notify", "notes": 1}).run
    wait_for(lambda: OutboxMessage.objects.filter(run=run).exclude(status="pending").exists()
             and not OutboxMessage.objects.filter(run=run, status="sending").exists(),
             timeout=30, interval=0.2, what="the notification to be delivered")
    message = OutboxMessage.objects.get(run=run)
    assert message.status == "delivered", (message.status, message.last_error)
    assert receiver.keys("/notify") == {message.idempotency_key: 1}
    kept, levels = message.result, 0
    while isinstance(kept, list):
        kept, levels = kept[0] if kept else None, levels + 1
    assert (levels, kept) == (KEPT_MAX_DEPTH, TOO_DEEP_KEPT)


def _held_message(receiver, run):
    """Wait until the receiver holds the run's one notification, mid-call."""
    wait_for(lambda: receiver.count("/notify") == 1, timeout=30, what="the delivery to arrive")
    message = OutboxMessage.objects.get(run=run)
    assert message.status == "sending" and message.claimed_until is not None
    return message


def test_deliverer_killed_mid_call_keyed_receiver_gets_it_again_under_the_same_key(
        in_acme, receiver, worker, outbox_worker, start_outbox_worker):
    receiver.hold_notify = True
    run = run_start(agent="herald", input={"url": f"{receiver.base}/notify", "notes": 1}).run
    message = _held_message(receiver, run)
    assert message.claimed_by.endswith(f":{outbox_worker.process.pid}")
    outbox_worker.kill()  # kill -9 the deliverer before it hears back
    receiver.release.set()
    start_outbox_worker("outbox-b")
    done = wait_for(lambda: OutboxMessage.objects.filter(id=message.id, status="delivered")
                    .first(), timeout=60, what="the expired claim to be delivered again")
    assert receiver.keys("/notify") == {message.idempotency_key: 2}  # the same key, twice
    assert receiver.charges("/notify") == {message.idempotency_key: 1}  # acted on once
    second = [r for r in receiver.requests if r["path"] == "/notify"][1]
    assert second["at"] >= message.claimed_until.timestamp()  # never while the claim was live
    assert done.attempts == 2 and done.claimed_by == ""


def test_deliverer_killed_mid_call_plain_receiver_is_left_to_a_person_never_resent(
        in_acme, acme_api, globex_api, plain_receiver, worker, outbox_worker,
        start_outbox_worker):
    plain_receiver.hold_notify = True  # like SMTP or Slack's chat.postMessage: no keys
    run = run_start(agent="herald", input={"url": f"{plain_receiver.base}/notify", "notes": 1,
                                           "connector": "test_plain"}).run
    message = _held_message(plain_receiver, run)
    outbox_worker.kill()
    plain_receiver.release.set()
    start_outbox_worker("outbox-c")
    wait_for(lambda: OutboxMessage.objects.filter(id=message.id, status="unknown").exists(),
             timeout=60, what="the message to be left to a person")
    assert plain_receiver.count("/notify") == 1  # not resent blindly
    assert RunEvent.objects.filter(run=run, kind="outbox_unknown").exists()

    listed = acme_api.get("/api/v1/outbox?status=unknown").json()["results"]
    assert message.id in [m["id"] for m in listed]
    assert globex_api.post(f"/api/v1/outbox/{message.id}/settle", {"delivered": False},
                           format="json").status_code == 404
    answer = acme_api.post(f"/api/v1/outbox/{message.id}/settle", {"delivered": False},
                           format="json")
    assert answer.status_code == 200 and answer.json()["settled_by"].startswith("api:")
    wait_for(lambda: OutboxMessage.objects.filter(id=message.id, status="delivered").exists(),
             timeout=60, what="the message to be sent again, as the person said")
    assert plain_receiver.count("/notify") == 2
    settled = RunEvent.objects.get(run=run, kind="outbox_settled")
    assert settled.data["delivered"] is False and settled.data["by"].startswith("api:")
    again = acme_api.post(f"/api/v1/outbox/{message.id}/settle", {"delivered": True},
                          format="json")
    assert again.status_code == 409 and again.json()["error"]["code"] == "outbox_not_unknown"


def test_deliverer_killed_mid_call_plain_receiver_that_can_be_asked_is_reconciled(
        in_acme, plain_receiver, worker, outbox_worker, start_outbox_worker):
    plain_receiver.hold_notify = True
    run = run_start(agent="herald", input={"url": f"{plain_receiver.base}/notify", "notes": 1,
                                           "connector": "test_plain", "searchable": True}).run
    message = _held_message(plain_receiver, run)
    outbox_worker.kill()
    plain_receiver.release.set()
    start_outbox_worker("outbox-d")
    wait_for(lambda: OutboxMessage.objects.filter(id=message.id, status="delivered").exists(),
             timeout=60, what="the lookup to find the message")
    assert plain_receiver.count("/notify") == 1
    assert RunEvent.objects.filter(run=run, kind="outbox_reconciled").exists()


def test_attempt_refused_before_it_was_sent_is_made_again_without_a_person(
        in_acme, plain_receiver):
    plain_receiver.charge_errors = [503]  # ConnectorError(sent=False): nothing arrived
    run = run_start(agent="payer", enqueue=False, input={
        "url": f"{plain_receiver.base}/charge", "amount": 3, "connector": "test_plain"}).run
    done = finished(run.id)
    assert done.status == "succeeded" and done.result["amount"] == 3
    assert not Approval.objects.filter(run=run).exists()
    effect = Effect.objects.get(run=run, name="charge")
    assert (effect.status, effect.attempts, effect.maybe_sent) == ("done", 2, False)
    assert plain_receiver.count("/charge") == 1


def test_model_call_whose_answer_was_lost_is_made_again_never_put_to_a_person(
        in_acme, fake_openai):  # noqa: F811
    credential_set(connector="model", secrets={"api_key": "sk-test", "base_url": fake_openai.url
                                               + "/v1"})
    fake_openai.configure("drop_next", 1)  # it answered; the answer never came back
    run = run_start(agent="worldly", enqueue=False, input={"what": "think"}).run
    done = finished(run.id)
    assert done.status == "succeeded"
    assert not Approval.objects.filter(run=run).exists()
    assert fake_openai.requests == 2
    effect = Effect.objects.get(run=run)
    assert done.tokens_used == effect.result["usage"]["total_tokens"]  # counted once


def test_person_who_says_delivered_gives_the_result_the_step_reads(
        in_acme, acme_api, plain_receiver, worker):
    plain_receiver.charge_errors = [500]  # it may have charged: a person must say
    run = run_start(agent="payer", enqueue=False, input={
        "url": f"{plain_receiver.base}/charge", "amount": 5, "connector": "test_plain"}).run
    assert finished(run.id).status == "waiting"
    approval = Approval.objects.get(run=run, kind="effect_outcome", status="pending")
    receipt = {"id": "ch_found_in_dashboard", "amount": 5}
    refused = acme_api.post(f"/api/v1/approvals/{approval.id}/decide",
                            {"decision": "reject", "result": receipt}, format="json")
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "result_not_allowed"
    assert acme_api.post(f"/api/v1/approvals/{approval.id}/decide",
                         {"decision": "approve", "result": receipt},
                         format="json").status_code == 200
    done = wait_for(lambda: (r := Run.objects.get(id=run.id)).status == "succeeded" and r,
                    timeout=60, what="the run to continue with the person's result")
    assert done.result == receipt
    assert plain_receiver.count("/charge") == 1


def test_operator_sees_unknown_messages_in_the_console_and_settles_them(acme, globex):
    with tenant_context(acme):
        run = run_start(agent="herald", enqueue=False, input={"url": "http://x.test/notify"}).run
        message = OutboxMessage.objects.create(
            run=run, name="welcome-mail", connector="email", args={}, status="unknown",
            idempotency_key=f"console-{run.id.hex[:20]}", next_attempt_at=timezone.now(),
            attempts=1, last_error="a deliverer stopped mid-call")
    connection.set_schema_to_public()
    client = staff_client()
    client.get("/admin/effects/outboxmessage/tenant/acme/")
    page = client.get("/admin/effects/outboxmessage/?status__exact=unknown").content.decode()
    assert "welcome-mail" in page and "a deliverer stopped mid-call" in page
    assert "Outbox of tenant acme" in page
    client.get("/admin/effects/outboxmessage/tenant/globex/")
    assert "welcome-mail" not in client.get("/admin/effects/outboxmessage/").content.decode()

    client.get("/admin/effects/outboxmessage/tenant/acme/")
    # a form shown for globex (another tab) settles nothing in acme, though the ids match
    client.post("/admin/effects/outboxmessage/", {
        "action": "settle_delivered", "_selected_action": [str(message.id)], "tenant": "globex"})
    with tenant_context(acme):
        assert OutboxMessage.objects.get(id=message.id).status == "unknown"
    response = client.post("/admin/effects/outboxmessage/", {
        "action": "settle_delivered", "_selected_action": [str(message.id)], "tenant": "acme"})
    assert response.status_code == 302
    with tenant_context(acme):
        settled = OutboxMessage.objects.get(id=message.id)
        assert (settled.status, settled.settled_by) == ("delivered", "admin:founder")
        assert RunEvent.objects.get(run=run, kind="outbox_settled").data["delivered"] is True


def test_message_sent_again_by_a_person_gets_a_full_budget_of_attempts(
        in_acme, acme_api, plain_receiver, worker):
    run = run_start(agent="herald", enqueue=False, input={"url": "http://x.test/notify"}).run
    message = OutboxMessage.objects.create(  # it went unknown on its last allowed attempt
        run=run, name="last-try", connector="test_plain", status="unknown", maybe_sent=True,
        args={"url": f"{plain_receiver.base}/notify", "n": 1},
        idempotency_key=f"budget-{run.id.hex[:20]}", next_attempt_at=timezone.now(),
        attempts=settings.OUTBOX_MAX_ATTEMPTS, last_error="timed out mid-send")
    assert acme_api.post(f"/api/v1/outbox/{message.id}/settle", {"delivered": False},
                         format="json").status_code == 200
    wait_for(lambda: OutboxMessage.objects.get(id=message.id).status in ("delivered", "failed"),
             timeout=60, what="the message to be sent again")
    assert OutboxMessage.objects.get(id=message.id).status == "delivered"
    assert plain_receiver.count("/notify") == 1


def test_claim_that_expired_before_anything_was_sent_is_sent_without_a_person(
        in_acme, plain_receiver, worker):
    run = run_start(agent="herald", enqueue=False, input={"url": "http://x.test/notify"}).run
    message = OutboxMessage.objects.create(  # its deliverer died before calling anyone
        run=run, name="never-sent", connector="test_plain", status="sending",
        args={"url": f"{plain_receiver.base}/notify", "n": 1}, claimed_by="gone:1",
        claimed_until=timezone.now() - timedelta(seconds=1), attempts=1,
        idempotency_key=f"unsent-{run.id.hex[:20]}", next_attempt_at=timezone.now())
    due_mark(what=TenantDue.What.OUTBOX)  # as its enqueue left it: the sweep's way back to it
    wait_for(lambda: OutboxMessage.objects.get(id=message.id).status in ("delivered", "unknown"),
             timeout=60, what="the expired claim to be taken")
    assert OutboxMessage.objects.get(id=message.id).status == "delivered"
    assert plain_receiver.count("/notify") == 1


def test_a_late_answer_recorded_first_is_kept_whatever_the_person_says(
        in_acme, acme_api, plain_receiver, worker):
    plain_receiver.charge_errors = [500]  # it may have charged: a person is asked
    run = run_start(agent="payer", enqueue=False, input={
        "url": f"{plain_receiver.base}/charge", "amount": 5, "connector": "test_plain"}).run
    assert finished(run.id).status == "waiting"
    approval = Approval.objects.get(run=run, kind="effect_outcome", status="pending")
    late = {"id": "ch_late", "amount": 5}  # the first attempt's answer arrived meanwhile
    Effect.objects.filter(run=run).update(status="done", result=late)
    assert acme_api.post(f"/api/v1/approvals/{approval.id}/decide", {"decision": "reject"},
                         format="json").status_code == 200
    done = wait_for(lambda: (r := Run.objects.get(id=run.id)).status == "succeeded" and r,
                    timeout=60, what="the run to continue")
    assert done.result == late
    assert plain_receiver.count("/charge") == 1  # "send again" did not overwrite the truth


def test_bad_filters_and_results_are_400s_in_the_api_error_shape(in_acme, acme_api):
    for path in ("/api/v1/outbox?run=nope", "/api/v1/approvals?run=nope"):
        answer = acme_api.get(path)
        assert answer.status_code == 400 and answer.json()["error"]["code"] == "invalid_filter"
    run = run_start(agent="herald", enqueue=False, input={"url": "http://x.test/notify"}).run
    approval = Approval.objects.create(run=run, visit=0, kind="effect_outcome", then="",
                                       request={"scope": "0", "effect": "x"})
    for result in (["not", "an", "object"], {"blob": "x" * 70_000}):
        answer = acme_api.post(f"/api/v1/approvals/{approval.id}/decide",
                               {"decision": "approve", "result": result}, format="json")
        assert answer.status_code == 400, answer.content
    assert Approval.objects.get(id=approval.id).status == "pending"
