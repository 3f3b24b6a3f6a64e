"""Crashes around real connectors: payments (Stripe wire format), email (a real SMTP server)
and model calls (OpenAI wire format). Receivers outside this machine are local fakes."""

import pytest

from integrations.services import credential_set
from runs import engine
from runs.agents import registry
from runs.approvals.models import Approval
from runs.effects.models import Effect
from runs.models import Run, RunEvent
from runs.services import run_start
from tests.support.fakes.fixtures import fake_openai, fake_stripe, smtp_server  # noqa: F401
from tests.support.runs import advanced
from tests.support.waiting import wait_for


def holder_worker(run_id, workers):
    owner = wait_for(lambda: Run.objects.filter(id=run_id).exclude(lease_owner="")
                     .values_list("lease_owner", flat=True).first(), what="a lease holder")
    pid = int(owner.rsplit(":", 1)[1])
    return next(w for w in workers if pid in w.pids())


def test_payment_reached_the_receiver_then_the_worker_died_one_charge(
        in_acme, fake_stripe, worker, start_worker):  # noqa: F811
    credential_set(connector="payments", secrets={"secret_key": "sk_test_acme",
                                                  "api_url": fake_stripe.url})
    workers = [worker, start_worker("pay-b")]
    fake_stripe.configure("delay", 2)  # charged at once, answered 2 s later (lease: 3 s)
    run = run_start(agent="worldly", input={"what": "pay", "amount": 4200}).run
    wait_for(lambda: len(fake_stripe.charges) == 1, timeout=30, what="the charge to land")
    holder_worker(run.id, workers).kill()  # before the worker hears back
    fake_stripe.configure("delay", 0)
    done = wait_for(lambda: (r := Run.objects.get(id=run.id)).status == "succeeded" and r,
                    timeout=60, what="the run to resume and finish")
    assert len(fake_stripe.charges) == 1
    assert list(fake_stripe.charges_by_key().values()) == [1]
    assert done.result["amount"] == 4200 and done.result["replayed"] is True


def test_email_outcome_unknown_after_a_crash_is_settled_by_a_person_and_sent_once(
        in_acme, acme_api, smtp_server, worker, start_worker):  # noqa: F811
    credential_set(connector="email", secrets={"host": "127.0.0.1", "port": smtp_server.port})
    workers = [worker, start_worker("mail-b")]
    smtp_server.inbox.hold_seconds = 5  # accepted; the 250 comes 5 s later
    run = run_start(agent="worldly", input={"what": "mail"}).run
    wait_for(lambda: len(smtp_server.messages) == 1, timeout=30, what="the message to arrive")
    holder_worker(run.id, workers).kill()
    smtp_server.inbox.hold_seconds = 0
    approval = wait_for(lambda: Approval.objects.filter(run=run, status="pending").first(),
                        timeout=60, what="'outcome unknown' in the inbox")
    assert approval.kind == "effect_outcome" and approval.request["connector"] == "email"
    assert Run.objects.get(id=run.id).status == "waiting"
    acme_api.post(f"/api/v1/approvals/{approval.id}/decide", {"decision": "approve"},
                  format="json")
    wait_for(lambda: Run.objects.get(id=run.id).status == "succeeded", timeout=60,
             what="the run to continue")
    assert len(smtp_server.messages) == 1
    assert Effect.objects.get(run=run).status == "done"


def test_recorded_model_call_is_not_made_again_and_its_tokens_count_once(
        in_acme, fake_openai, worker, start_worker, tmp_path):  # noqa: F811
    credential_set(connector="model", secrets={"api_key": "sk-test", "base_url": fake_openai.url
                                               + "/v1"})
    workers = [worker, start_worker("model-b")]
    marker = tmp_path / "pause"
    marker.touch()
    run = run_start(agent="worldly", input={"what": "think", "pause_while": str(marker)}).run
    wait_for(lambda: Effect.objects.filter(run=run, status="done").exists(), timeout=30,
             what="the model call to be recorded")
    holder_worker(run.id, workers).kill()  # after the call was recorded, before the step ended
    marker.unlink()
    done = wait_for(lambda: (r := Run.objects.get(id=run.id)).status == "succeeded" and r,
                    timeout=90, what="the run to resume and finish")
    assert done.lease_epoch >= 2
    assert fake_openai.requests == 1
    usage = Effect.objects.get(run=run).result["usage"]
    assert done.tokens_used == usage["total_tokens"] > 0


def test_model_call_over_budget_is_not_sent_and_the_reason_is_recorded(
        in_acme, fake_openai):  # noqa: F811

    credential_set(connector="model", secrets={"api_key": "sk-test", "base_url": fake_openai.url
                                               + "/v1"})
    run = run_start(agent="worldly", enqueue=False, max_tokens=55,
                    input={"what": "think", "think_again": True, "max_tokens": 50}).run
    while engine.advance(run_id=run.id) == engine.Outcome.SLICE_USED:
        pass
    done = Run.objects.get(id=run.id)
    assert done.status == "failed" and "budget" in done.error
    assert fake_openai.requests == 1  # the second call was never sent
    event = RunEvent.objects.get(run=run, kind="budget_exceeded")
    assert "token budget" in event.data["reason"]
    assert done.tokens_used == Effect.objects.get(run=run).result["usage"]["total_tokens"]


@pytest.mark.parametrize("approve", [True, False])
def test_budget_can_park_for_a_person_who_raises_it(in_acme, acme_api, fake_openai, worker,  # noqa: F811
                                                    approve):
    credential_set(connector="model", secrets={"api_key": "sk-test", "base_url": fake_openai.url
                                               + "/v1"})
    agent = registry.get("worldly")
    agent.on_budget = "approve"
    try:
        run = run_start(agent="worldly", enqueue=False, max_tokens=55,
                        input={"what": "think", "think_again": True, "max_tokens": 50}).run
        assert advanced(run.id) == engine.Outcome.PARKED
        approval = Approval.objects.get(run=run, kind="budget")
        acme_api.post(f"/api/v1/approvals/{approval.id}/decide",
                      {"decision": "approve" if approve else "reject"}, format="json")
        run.refresh_from_db()
        if approve:
            assert run.max_tokens == 110 and run.status in ("queued", "running", "succeeded")
            wait_for(lambda: Run.objects.get(id=run.id).status == "succeeded", timeout=30,
                     what="a worker to finish the run under its raised budget")
            assert fake_openai.requests == 2
        else:
            assert run.status == "failed" and "not raised" in run.error
            assert fake_openai.requests == 1
    finally:
        agent.on_budget = "fail"
