"""Honest forks: a fork of a parked checkpoint waits again for what its source waited for, and
never inherits a decision; a fork of a fan-out join reads the branch results."""

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from runs import engine
from runs.approvals.models import Approval, EventGate
from runs.approvals.services import ApprovalError, approval_decide, event_deliver
from runs.dispatch.models import Wakeup
from runs.dispatch.services import wakeups_fire
from runs.models import Branch, Checkpoint, Run
from runs.services import run_fork, run_start
from tests.support.waiting import wait_for


def start(agent, **input):
    return run_start(agent=agent, input=input, enqueue=False).run


def settle(run_id, timeout=60, *, parked_is_done=True):
    """Drive the run in this process until it parks or ends (a worker may take a turn too)."""
    def settled():
        engine.advance(run_id=run_id, sleep=lambda s: None)
        run = Run.objects.get(id=run_id)
        if run.is_finished or (parked_is_done and run.status == "waiting"):
            return run
        return None

    return wait_for(settled, timeout=timeout, what=f"run {run_id} to park or end")


def test_fork_at_an_approval_opens_a_new_one_for_its_deciders(in_acme):
    run = start("waiter", how="approval", deciders=["api:cfo"])
    assert settle(run.id).status == "waiting"
    approval_decide(approval_id=Approval.objects.get(run=run).id, approve=True, by="api:cfo")
    assert settle(run.id).result["approved"] is True

    fork = run_fork(run_id=run.id, visit=1, enqueue=False)
    assert fork.status == "waiting" and fork.waiting_reason == "approval: Ship it?"
    reopened = Approval.objects.get(run=fork)
    assert reopened.status == "pending" and reopened.deciders == ["api:cfo"]
    assert reopened.request["title"] == "Ship it?" and reopened.then == "decided"
    assert engine.advance(run_id=fork.id) == engine.Outcome.NOT_CLAIMED  # nothing runs unapproved
    with pytest.raises(ApprovalError, match="may not decide"):
        approval_decide(approval_id=reopened.id, approve=True, by="api:default")
    approval_decide(approval_id=reopened.id, approve=False, by="api:cfo")
    done = settle(fork.id)
    assert done.status == "succeeded" and done.result["approved"] is False
    assert Run.objects.get(id=run.id).result["approved"] is True  # the source is untouched


def test_fork_at_the_decided_checkpoint_asks_again_instead_of_inheriting_the_decision(in_acme):
    run = start("waiter", how="approval")
    settle(run.id)
    approval_decide(approval_id=Approval.objects.get(run=run).id, approve=True, by="api:boss")
    settle(run.id)
    assert Checkpoint.objects.get(run=run, visit=2).state["approval"]["by"] == "api:boss"

    fork = run_fork(run_id=run.id, visit=2, enqueue=False)
    assert fork.status == "waiting" and fork.forked_from_visit == 2
    forked = Checkpoint.objects.get(run=fork)
    assert forked.visit == 1 and "approval" not in forked.state
    assert Approval.objects.get(run=fork).status == "pending"
    assert engine.advance(run_id=fork.id) == engine.Outcome.NOT_CLAIMED


def test_fork_at_an_event_gate_waits_for_a_new_event(in_acme):
    key = f"doc-{uuid.uuid4()}"
    run = start("waiter", how="event", kind="docs.signed", key=key)
    settle(run.id)
    event_deliver(kind="docs.signed", key=key, payload={"signed": "first"}, source_id=key)
    assert settle(run.id).result == {"signed": "first"}

    for visit in (1, 2):  # at the gate, and at the checkpoint the event's wake-up wrote
        fork = run_fork(run_id=run.id, visit=visit, enqueue=False)
        assert fork.status == "waiting"
        assert EventGate.objects.get(run=fork).status == "open"
        assert engine.advance(run_id=fork.id) == engine.Outcome.NOT_CLAIMED
        delivered = event_deliver(kind="docs.signed", key=key, payload={"signed": visit},
                                  source_id=f"{key}-{visit}")
        assert delivered.resumed == [fork.id]
        assert settle(fork.id).result == {"signed": visit}


def test_fork_at_a_sleep_sets_a_new_timer(in_acme):
    run = start("waiter", how="sleep", seconds=3600)
    settle(run.id)
    Wakeup.objects.filter(run_id=run.id).update(due_at=timezone.now() - timedelta(seconds=1))
    wakeups_fire()
    assert settle(run.id).result == "rested"

    fork = run_fork(run_id=run.id, visit=1, enqueue=False)
    assert fork.status == "waiting"
    timer = Wakeup.objects.get(run_id=fork.id)
    assert timer.visit == 1
    assert timezone.now() + timedelta(minutes=59) < timer.due_at < \
        timezone.now() + timedelta(minutes=61)  # the whole sleep again, from the fork's start
    assert engine.advance(run_id=fork.id) == engine.Outcome.NOT_CLAIMED


def test_fork_at_a_child_run_starts_a_new_child(in_acme, worker):
    run = start("waiter", how="child")
    done = settle(run.id, parked_is_done=False)
    assert done.status == "succeeded" and done.result["status"] == "succeeded"
    first_child = Run.objects.get(parent=run)

    fork = run_fork(run_id=run.id, visit=1)
    assert fork.status == "waiting"
    forked = settle(fork.id, parked_is_done=False)
    child = Run.objects.get(parent=fork)
    assert child.id != first_child.id and child.agent == "research"
    assert forked.status == "succeeded" and forked.result["run"] == str(child.id)


def test_fork_at_a_fan_out_join_reads_the_branch_results(in_acme, worker):
    run = start("fanner", count=4)
    assert settle(run.id, parked_is_done=False).result == {"branches": 4, "total": 14}

    fork = run_fork(run_id=run.id, visit=1, enqueue=False)
    assert fork.status == "queued"  # every branch succeeded: straight on to the join
    assert list(Branch.objects.filter(run=fork).order_by("index").values_list("result", flat=True)) \
        == [0, 1, 4, 9]
    assert settle(fork.id).result == {"branches": 4, "total": 14}
