"""Cancel wins: a cancel asked while a run parks ends it in the parking transaction, cancelling a
parent cancels its whole tree, and a late branch report wakes no run parked on something else."""

import threading

import pytest
from django.db import connection, connections, transaction
from django_tenants.utils import tenant_context

from runs import engine
from runs.approvals.models import Approval, EventGate
from runs.dispatch.models import ReadyRun, Wakeup
from runs.models import Branch, Checkpoint, Run, RunEvent
from runs.services import run_cancel, run_enqueue, run_start
from tests.support.runs import advanced
from tests.support.waiting import wait_for


def kinds(run_id):
    return list(RunEvent.objects.filter(run_id=run_id).order_by("id")
                .values_list("kind", flat=True))


@pytest.mark.parametrize("how", ["approval", "event", "sleep", "child", "fan_out"])
def test_cancel_asked_while_the_run_parks_ends_it_with_nothing_left_open(in_acme, how):
    run = run_start(agent="parker", input={"how": how}, enqueue=False).run
    assert advanced(run.id) == engine.Outcome.ENDED
    run.refresh_from_db()
    assert run.status == "cancelled" and run.lease_owner == "" and run.finished_at
    assert not Approval.objects.filter(run=run).exists()
    assert not EventGate.objects.filter(run=run).exists()
    assert not Wakeup.objects.filter(run_id=run.id).exists()
    assert not Branch.objects.filter(run=run).exists()
    assert not Run.objects.filter(parent=run).exists()  # no child started
    assert not ReadyRun.objects.filter(run_id=run.id).exists()
    assert "run_parked" not in kinds(run.id) and kinds(run.id)[-1] == "run_cancelled"
    # The checkpoint still says what the run was about to wait for (a fork re-opens it).
    assert Checkpoint.objects.get(run=run, visit=1).waiting["kind"] == \
        {"sleep": "timer", "child": "child_run"}.get(how, how)


def test_cancelling_a_parent_cancels_its_children_and_theirs(acme, acme_api, worker):
    response = acme_api.post("/api/v1/runs", {"agent": "nest", "input": {"depth": 2}},
                             format="json")
    root = response.json()["id"]
    with tenant_context(acme):
        leaf = wait_for(lambda: Approval.objects.filter(run__parent__parent_id=root,
                                                        status="pending").first(),
                        timeout=30, what="the grandchild's approval")
        tree = [root, leaf.run.parent_id, leaf.run_id]
        assert Run.objects.get(id=tree[1]).status == "waiting"

    cancelled = acme_api.post(f"/api/v1/runs/{root}/cancel")
    assert cancelled.status_code == 202 and cancelled.json()["status"] == "cancelled"
    with tenant_context(acme):
        assert [Run.objects.get(id=i).status for i in tree] == ["cancelled"] * 3
        assert Approval.objects.get(id=leaf.id).status == "cancelled"
        assert not EventGate.objects.filter(run_id__in=tree, status="open").exists()
        for run_id in tree:
            assert kinds(run_id).count("run_cancelled") == 1
        assert not ReadyRun.objects.filter(run_id__in=tree).exists()


# Exclusive: it needs the worker's two slots and a branch held for seconds, and under two
# shards on two CPUs branch 1 was twice not seen finishing within 30 s (not understood yet).
@pytest.mark.exclusive
def test_a_late_branch_report_does_not_wake_a_run_parked_on_something_else(in_acme, worker,
                                                                          tmp_path):
    marker = tmp_path / "hold-branch-1"
    marker.touch()
    run = run_start(agent="fan_ask", input={"marker": str(marker)}).run
    wait_for(lambda: Branch.objects.filter(run=run, index=0, status="done").exists() and
             Branch.objects.filter(run=run, index=1, status="running").exists(),
             timeout=30, what="branch 0 done while branch 1 holds")

    with transaction.atomic():  # the run moves on without branch 1, as an operator re-queue would
        Run.objects.filter(id=run.id).update(status="queued", waiting_reason="")
        run_enqueue(run.id)
    approval = wait_for(lambda: Approval.objects.filter(run=run, status="pending").first(),
                        timeout=30, what="the join to park on its approval")
    assert approval.visit == 2

    marker.unlink()  # branch 1 finishes late, for visit 1
    wait_for(lambda: Branch.objects.filter(run=run, index=1, status="done").exists(),
             timeout=30, what="branch 1 to finish")
    run.refresh_from_db()
    assert run.status == "waiting" and run.waiting_reason == "approval: Use these results?"
    assert Approval.objects.get(id=approval.id).status == "pending"
    assert "fan_in" not in kinds(run.id)


def test_cancel_asked_before_a_run_is_claimed_again_wins_over_parking_it(in_acme):
    """Its worker died with the cancel asked; the next claim ends it, instead of parking it as
    a poison step (or handing it back) and dropping the person's cancel."""
    run = run_start(agent="slowpoke", input={"seconds": 0}, enqueue=False).run
    Run.objects.filter(id=run.id).update(status="running", cancel_requested=True,
                                         claims_without_checkpoint=99)  # lease long gone
    assert advanced(run.id) == engine.Outcome.ENDED
    run.refresh_from_db()
    assert run.status == "cancelled" and run.finished_at and run.lease_owner == ""
    assert "poison_step" not in kinds(run.id) and kinds(run.id)[-1] == "run_cancelled"


def test_cancel_reaches_a_child_started_while_it_waited_for_the_parent(acme):
    """The parent's worker holds the parent's row while it starts a child (parking on it); a
    cancel that waited for that row still cancels the child committed meanwhile."""
    with tenant_context(acme):
        parent = run_start(agent="slowpoke", input={}, enqueue=False).run
    child_started, cancel_done, outcome = threading.Event(), threading.Event(), {}

    def parking_worker():
        with tenant_context(acme), transaction.atomic():
            Run.objects.select_for_update().get(id=parent.id)
            outcome["child"] = run_start(agent="slowpoke", input={}, parent_id=parent.id,
                                         enqueue=False).run.id
            child_started.set()
            wait_for(lambda: blocked_on_lock(), timeout=20, what="the cancel to wait")
        connections.close_all()

    def blocked_on_lock():
        with connections["default"].cursor() as cursor:  # in a transaction: a fresh snapshot
            cursor.execute("SELECT pg_stat_clear_snapshot()")
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = "
                           "'Lock' AND datname = current_database()")
            return cursor.fetchone()[0] > 0

    def cancelling():
        with tenant_context(acme):
            run_cancel(run_id=parent.id)
        cancel_done.set()
        connections.close_all()

    worker = threading.Thread(target=parking_worker)
    worker.start()
    assert child_started.wait(20)
    canceller = threading.Thread(target=cancelling)
    canceller.start()
    worker.join(30)
    canceller.join(30)
    assert cancel_done.is_set()
    connection.set_schema_to_public()
    with tenant_context(acme):
        assert Run.objects.get(id=parent.id).status == "cancelled"
        assert Run.objects.get(id=outcome["child"]).status == "cancelled"
