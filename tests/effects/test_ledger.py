"""The effect ledger: each externally visible operation happens once, whatever crashes."""

import random

from django.db import transaction

from runs.approvals.models import Approval
from runs.effects.models import Effect, OutboxMessage
from runs.models import Run, RunEvent
from runs.services import run_enqueue, run_start
from tests.support.runs import finished
from tests.support.waiting import wait_for


def test_a_step_that_runs_again_gets_the_recorded_result(in_acme, receiver):
    run = run_start(agent="payer", enqueue=False, input={
        "url": f"{receiver.base}/charge", "amount": 500, "fail_attempts_after_effect": 2}).run
    done = finished(run.id)
    assert done.status == "succeeded" and done.result["amount"] == 500
    assert receiver.count() == 1  # three attempts of the step, one charge
    effect = Effect.objects.get(run=run, name="charge")
    assert (effect.status, effect.attempts) == ("done", 1)
    assert len(effect.idempotency_key) == 48


def test_reusing_an_effect_name_with_other_arguments_is_refused(in_acme, receiver):
    run = run_start(agent="payer", enqueue=False, input={
        "url": f"{receiver.base}/charge", "amount": 5, "reuse_name": True}).run
    done = finished(run.id)
    assert done.status == "failed" and "different arguments" in done.error
    assert receiver.count() == 1


def test_killed_after_the_charge_reached_the_receiver_resumes_with_one_charge(
        acme, in_acme, receiver, worker, start_worker):
    start_worker("payments-b")
    run = run_start(agent="payer", input={"url": f"{receiver.base}/charge", "amount": 900},
                    enqueue=False).run
    receiver.kill_runs.add(str(run.id))
    _enqueue(run.id)
    done = wait_for(lambda: (r := Run.objects.get(id=run.id)).status == "succeeded" and r,
                    timeout=60, what="the run to resume and finish")
    assert receiver.count() == 2  # the first call, then the resumed one with the same key
    assert receiver.charges() == {Effect.objects.get(run=run).idempotency_key: 1}
    assert done.result["amount"] == 900 and done.lease_epoch >= 2


def test_plain_receiver_found_by_lookup_is_reconciled_not_resent(
        in_acme, plain_receiver, worker, start_worker):
    start_worker("plain-b")
    run = run_start(agent="payer", enqueue=False, input={
        "url": f"{plain_receiver.base}/charge", "amount": 7, "connector": "test_plain",
        "searchable": True}).run
    plain_receiver.kill_runs.add(str(run.id))
    _enqueue(run.id)
    wait_for(lambda: Run.objects.get(id=run.id).status == "succeeded", timeout=60,
             what="the run to reconcile and finish")
    assert plain_receiver.count() == 1
    assert RunEvent.objects.filter(run=run, kind="effect_reconciled").exists()


def test_unknown_outcome_parks_for_a_person_who_confirms_it_was_sent(
        in_acme, acme_api, plain_receiver, worker, start_worker):
    start_worker("unknown-b")
    run = run_start(agent="payer", enqueue=False, input={
        "url": f"{plain_receiver.base}/charge", "amount": 7, "connector": "test_plain"}).run
    plain_receiver.kill_runs.add(str(run.id))
    _enqueue(run.id)
    approval = wait_for(lambda: Approval.objects.filter(run=run, kind="effect_outcome",
                                                        status="pending").first(),
                        timeout=60, what="an 'outcome unknown' item in the inbox")
    assert Run.objects.get(id=run.id).status == "waiting"
    assert approval.request["effect"] == "charge"
    acme_api.post(f"/api/v1/approvals/{approval.id}/decide", {"decision": "approve"},
                  format="json")
    done = wait_for(lambda: (r := Run.objects.get(id=run.id)).status == "succeeded" and r,
                    timeout=60, what="the run to continue")
    assert plain_receiver.count() == 1  # confirmed as sent: never sent again
    assert done.result["confirmed_by"].startswith("api:")


def test_unknown_outcome_rejected_is_sent_again_once(
        in_acme, acme_api, plain_receiver, worker, start_worker):
    start_worker("resend-b")
    run = run_start(agent="payer", enqueue=False, input={
        "url": f"{plain_receiver.base}/charge", "amount": 8, "connector": "test_plain"}).run
    plain_receiver.kill_runs.add(str(run.id))
    _enqueue(run.id)
    approval = wait_for(lambda: Approval.objects.filter(run=run, status="pending").first(),
                        timeout=60, what="the inbox item")
    acme_api.post(f"/api/v1/approvals/{approval.id}/decide", {"decision": "reject"},
                  format="json")
    wait_for(lambda: Run.objects.get(id=run.id).status == "succeeded", timeout=60,
             what="the run to send again and finish")
    assert plain_receiver.count() == 2


def test_outbox_is_delivered_with_retries_and_its_status_is_visible(
        in_acme, acme_api, receiver, worker):
    receiver.notify_failures = 2
    run = run_start(agent="payer", input={"url": f"{receiver.base}/charge", "amount": 1}).run
    wait_for(lambda: OutboxMessage.objects.filter(run=run, status="delivered").exists(),
             timeout=60, what="the receipt to be delivered")
    message = OutboxMessage.objects.get(run=run)
    assert message.attempts == 3 and receiver.count("/notify") == 3
    assert receiver.charges("/notify") == {message.idempotency_key: 1}
    status = acme_api.get(f"/api/v1/runs/{run.id}/effects").json()
    assert status["outbox"][0]["status"] == "delivered" and status["effects"][0]["name"] == "charge"


# Ten kills, ten worker starts at once and another shard's tests share two cores: a run may be
# claimed again and again (killed holders, heartbeats starved past the 3 s lease) before its
# step reaches a checkpoint. Parking it as a poison step would be right (tests/runs/test_poison.py)
# but is not what this soak is about, so its workers tolerate more claims.
SOAK_ENV = {"RUN_MAX_CLAIMS_WITHOUT_CHECKPOINT": "50"}


def test_many_runs_with_random_worker_kills_each_effect_happens_once(
        in_acme, receiver, own_workers, start_worker, tmp_path):
    workers = [start_worker("soak-a", concurrency=2, env=SOAK_ENV),
               start_worker("soak-b", env=SOAK_ENV), start_worker("soak-c", env=SOAK_ENV)]
    rng = random.Random(7)
    hold = tmp_path / "hold"  # runs stay mid-step (once each) until every kill has landed
    hold.touch()
    runs = [run_start(agent="triple", input={"url": f"{receiver.base}/charge", "seconds": 0.02,
                                             "hold_while": str(hold)}).run.id
            for _ in range(200)]
    kills = 0

    def live_holders():
        pids = {int(owner.rsplit(":", 1)[1]) for owner in Run.objects.filter(
            id__in=runs, status="running").exclude(lease_owner="")
            .values_list("lease_owner", flat=True)}
        return [w for w in workers if pids & w.pids()]

    while kills < 10:
        victim = rng.choice(wait_for(live_holders, timeout=60, interval=0.1,
                                     what="a worker holding a run mid-step"))
        victim.kill()
        workers.remove(victim)
        # not waited for: the others hold runs meanwhile, and a start takes seconds of its own
        workers.append(start_worker(f"soak-{kills}", env=SOAK_ENV, ready=False))
        kills += 1
    hold.unlink()

    def all_succeeded():
        left = Run.objects.filter(id__in=runs).exclude(status="succeeded")
        stopped = list(left.exclude(status__in=["queued", "running"]).values_list("status", "error"))
        assert not stopped, f"runs stopped short of success: {stopped[:3]}"
        return not left.exists()

    wait_for(all_succeeded, timeout=300, interval=0.5, what="all 200 runs to finish")
    assert kills >= 10
    keys = set(Effect.objects.filter(run_id__in=runs).values_list("idempotency_key", flat=True))
    assert len(keys) == 600
    assert receiver.charges() == {key: 1 for key in keys}


def _enqueue(run_id):
    with transaction.atomic():
        run_enqueue(run_id)
