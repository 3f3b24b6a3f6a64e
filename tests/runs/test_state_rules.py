"""State rules held by PostgreSQL: the hot path writes raw SQL, which Django's `choices` never
check, so the database refuses a row in a state the platform has no meaning for."""

import uuid

import pytest
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from runs.agents import registry
from runs.approvals.models import Approval, EventGate
from runs.effects.models import Effect
from runs.models import Branch, Run, RunEvent
from runs.retention.models import Archive
from runs.services import run_cancel, run_start


def refused(sql: str, params: list) -> str:
    """Run a raw statement that breaks a rule; returns the name of the constraint that refused."""
    with pytest.raises(IntegrityError) as refusal, transaction.atomic(), \
            connection.cursor() as cursor:
        cursor.execute(sql, params)
    return refusal.value.__cause__.diag.constraint_name


def parked_run(**fields) -> Run:
    run = run_start(agent="chatter", input={"steps": 1}, enqueue=False).run
    Run.objects.filter(id=run.id).update(status=Run.Status.WAITING, **fields)
    return run


@pytest.mark.parametrize("sql, rule", [
    ("SET status = 'bogus'", "run_status_valid"),
    ("SET durability = 'lazy'", "run_durability_valid"),
    ("SET status = 'running', lease_owner = 'w:1', lease_expires_at = NULL",
     "run_lease_owner_iff_expiry"),
    ("SET lease_owner = '', lease_expires_at = now()", "run_lease_owner_iff_expiry"),
    ("SET status = 'succeeded'", "run_finished_iff_finished_at"),  # no finished_at
    ("SET status = 'failed', finished_at = now()", None),  # the legal pair, for contrast
])
def test_the_database_refuses_a_run_row_in_a_meaningless_state(in_acme, sql, rule):
    run = run_start(agent="chatter", input={"steps": 1}, enqueue=False).run
    statement = f"UPDATE {Run._meta.db_table} {sql} WHERE id = %s"
    if rule is None:
        with connection.cursor() as cursor:
            cursor.execute(statement, [run.id])
        return
    assert refused(statement, [run.id]) == rule


def test_a_run_reopened_from_its_end_must_drop_its_finished_at(in_acme):
    run = run_start(agent="chatter", input={"steps": 1}, enqueue=False).run
    Run.objects.filter(id=run.id).update(status=Run.Status.FAILED, finished_at=timezone.now())
    assert refused(f"UPDATE {Run._meta.db_table} SET status = 'queued' WHERE id = %s",
                   [run.id]) == "run_finished_iff_finished_at"


@pytest.mark.parametrize("sql, rule", [
    ("SET status = 'bogus'", "branch_status_valid"),
    ("SET status = 'running', lease_owner = 'w:1'", "branch_lease_owner_iff_expiry"),
    ("SET status = 'done'", "branch_finished_iff_finished_at"),
    ("SET finished_at = now()", "branch_finished_iff_finished_at"),  # still pending
])
def test_the_database_refuses_a_branch_row_in_a_meaningless_state(in_acme, sql, rule):
    branch = Branch.objects.create(run=parked_run(), visit=1, index=0, step="talk")
    assert refused(f"UPDATE {Branch._meta.db_table} {sql} WHERE id = %s", [branch.id]) == rule


def test_cancelling_a_run_at_a_fan_out_dates_the_branches_it_fails(in_acme):
    """The cancel failed pending branches without a finished_at; the rule found it."""
    run = parked_run(waiting_reason="fan_out: 2 branches")
    for index in (0, 1):
        Branch.objects.create(run=run, visit=1, index=index, step="talk")
    run_cancel(run_id=run.id)
    assert [(b.status, b.finished_at is not None) for b in Branch.objects.filter(run=run)] == \
        [("failed", True)] * 2


def test_a_run_has_one_pending_approval_at_most(in_acme):
    run = parked_run()
    first = Approval.objects.create(run=run, visit=1, then="talk", status="approved")
    Approval.objects.create(run=run, visit=2, then="talk")  # pending
    table = Approval._meta.db_table
    assert refused(f"UPDATE {table} SET status = 'pending' WHERE id = %s",
                   [first.id]) == "approval_one_pending_per_run"
    assert refused(f"UPDATE {table} SET status = 'maybe' WHERE id = %s",
                   [first.id]) == "approval_status_valid"
    assert refused(f"UPDATE {table} SET kind = 'vibes' WHERE id = %s",
                   [first.id]) == "approval_kind_valid"
    other = parked_run()  # another run's pending approval is its own
    Approval.objects.create(run=other, visit=1, then="talk")


def test_a_run_has_one_open_event_gate_at_most(in_acme):
    run = parked_run()
    first = EventGate.objects.create(run=run, visit=1, kind="k", key="a", then="talk",
                                     status="resolved")
    EventGate.objects.create(run=run, visit=2, kind="k", key="b", then="talk")  # open
    table = EventGate._meta.db_table
    assert refused(f"UPDATE {table} SET status = 'open' WHERE id = %s",
                   [first.id]) == "event_gate_one_open_per_run"
    assert refused(f"UPDATE {table} SET status = 'ajar' WHERE id = %s",
                   [first.id]) == "event_gate_status_valid"


def test_effect_and_archive_statuses_are_the_declared_ones(in_acme):
    run = parked_run()
    effect = Effect.objects.create(run=run, scope="1", name="post", connector="test_keyed",
                                   args_hash="0" * 64, idempotency_key=uuid.uuid4().hex)
    assert refused(f"UPDATE {Effect._meta.db_table} SET status = 'sent?' WHERE id = %s",
                   [effect.id]) == "effect_status_valid"
    archive = Archive.objects.create(run_id=uuid.uuid4(), status="failed")
    assert refused(f"UPDATE {Archive._meta.db_table} SET status = 'lost' WHERE id = %s",
                   [archive.id]) == "archive_status_valid"


def test_a_run_starts_with_its_checkpoint_and_event_in_one_statement(in_acme):
    """`run_start` writes its three rows as one statement (agentplatform.rows): what they hold
    is what the ORM would have written, and the run it returns saves as an UPDATE."""
    with CaptureQueriesContext(connection) as queries:
        run = run_start(agent="chatter", input={"steps": 1}, enqueue=False, by="tester").run
    inserts = [q["sql"] for q in queries.captured_queries if "INSERT INTO" in q["sql"]]
    assert len(inserts) == 1 and all(
        table in inserts[0] for table in ('"runs_run"', '"runs_checkpoint"', '"runs_runevent"'))
    stored = Run.objects.get(id=run.id)
    assert (stored.status, stored.agent, stored.input, stored.created_at) == \
        ("queued", "chatter", {"steps": 1}, run.created_at)
    assert [(c.visit, c.step, c.state) for c in stored.checkpoints.all()] == \
        [(0, registry.get("chatter", None).start, {"steps": 1})]
    [event] = RunEvent.objects.filter(run=run)
    assert (event.kind, event.visit, event.data["by"]) == ("run_created", 0, "tester")
    run.waiting_reason = "saved again"
    run.save()  # an UPDATE: an INSERT would break the primary key
    assert Run.objects.get(id=run.id).waiting_reason == "saved again"


def test_a_run_whose_parent_is_gone_is_refused_not_answered_with_another_run(in_acme):
    """Its foreign key fails at commit; with no idempotency key that is no race to resolve by
    looking up a run without a key (which would answer with an unrelated run)."""
    run_start(agent="chatter", input={"steps": 1}, enqueue=False)  # a run without a key
    gone = uuid.uuid4()
    with pytest.raises(IntegrityError):
        run_start(agent="chatter", input={"steps": 1}, enqueue=False, parent_id=gone)
    assert not Run.objects.filter(parent_id=gone).exists()
