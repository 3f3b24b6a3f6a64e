"""The engine at its edges, driven in-process: interrupts a step cannot swallow, a database
error that stops the worker instead of failing the run, poison counts, fenced branches, runs
whose agent version this worker lacks, and the bounded async write queue."""

import threading
import uuid

import psycopg
import pytest
from django.conf import settings
from django.db import OperationalError, connection

from runs import engine
from runs.dispatch.models import ReadyRun
from runs.dispatch.services import dispatch_ready, ready_defer
from runs.effects.models import Effect, OutboxMessage
from runs.effects.services import EffectError, Scope, args_digest, effect_perform
from runs.engine.harness import ERROR_MAX_CHARS
from runs.models import Branch, LogEntry, Run, RunEvent
from runs.services import run_requeue
from tests.effects.receiver import Receiver
from tests.support.runs import advanced, finished, kinds, start


@pytest.fixture
def receiver():
    server = Receiver()
    yield server
    server.close()


def test_a_step_cannot_swallow_a_budget_stop(in_acme):
    run = finished(start("swallower", input={"how": "budget"}, max_tokens=1).id)
    assert run.status == "failed" and "budget" in run.error
    assert "budget_exceeded" in kinds(run)


def test_a_step_cannot_swallow_a_question_for_a_person(in_acme, receiver):
    url = f"{receiver.base}/charge"
    run = start("swallower", input={"how": "person", "url": url})
    Effect.objects.create(run=run, scope="0", name="ask", connector="test_keyed",
                          args={"url": url}, args_hash=args_digest({"url": url}),
                          idempotency_key=uuid.uuid4().hex, status="unknown", attempts=1)
    assert advanced(run.id) == engine.Outcome.PARKED
    run.refresh_from_db()
    assert run.status == "waiting" and run.steps_taken == 0  # never went on to "after"
    assert receiver.count() == 0


def test_a_database_error_in_a_step_stops_the_worker_instead_of_failing_the_run(in_acme):
    run = start("db_away")
    with pytest.raises(OperationalError):
        engine.advance(run_id=run.id, sleep=lambda s: None)
    run.refresh_from_db()
    assert run.status == "running" and run.lease_owner  # the watchdog retries it on expiry
    assert "step_error" not in kinds(run)  # no retries burnt on a database that is away


def test_a_run_claimed_too_often_without_a_checkpoint_is_parked_for_a_person(in_acme):
    run = start("chatter", input={"steps": 2})
    for _ in range(settings.RUN_MAX_CLAIMS_WITHOUT_CHECKPOINT):  # each claimer "died"
        assert engine.run_claim(run_id=run.id, owner="doomed", lease_seconds=-1)  # died
    assert advanced(run.id) == engine.Outcome.PARKED
    run.refresh_from_db()
    assert run.status == "waiting" and "poison step" in run.waiting_reason
    assert "'talk'" in run.waiting_reason
    assert "poison_step" in kinds(run)
    run_requeue(run_id=run.id, by="test")
    run.refresh_from_db()
    assert run.claims_without_checkpoint == 0
    assert finished(run.id).status == "succeeded"


def test_every_checkpoint_resets_the_poison_count(in_acme):
    run = start("chatter", input={"steps": 30})
    for _ in range(settings.RUN_MAX_CLAIMS_WITHOUT_CHECKPOINT):
        assert engine.run_claim(run_id=run.id, owner="doomed", lease_seconds=-1)  # died
        # ...and each made progress: a checkpoint was written under its lease
        Run.objects.filter(id=run.id).update(claims_without_checkpoint=0)
    assert finished(run.id, slice_seconds=0).status == "succeeded"  # one claim per step


def test_a_branch_that_lost_its_lease_cannot_start_an_effect(in_acme, receiver):
    run = start("overtaken", input={"url": f"{receiver.base}/charge", "take_over": True})
    assert advanced(run.id) == engine.Outcome.PARKED
    with pytest.raises(engine.LeaseLost):
        engine.branch_advance(run_id=run.id, index=0)
    assert receiver.count() == 0
    assert not Effect.objects.filter(run=run).exists()
    branch = Branch.objects.get(run=run)
    assert (branch.status, branch.lease_owner, branch.lease_epoch) == ("running", "successor", 2)


def test_branch_effects_are_fenced_on_the_branch_lease(in_acme, receiver):
    run = start("overtaken", input={"url": f"{receiver.base}/charge"})
    assert advanced(run.id) == engine.Outcome.PARKED
    assert engine.branch_advance(run_id=run.id, index=0) == engine.Outcome.ENDED
    assert finished(run.id).status == "succeeded" and receiver.count() == 1
    assert Effect.objects.get(run=run).scope == "1/b0"


def test_a_worker_whose_lease_moved_on_cannot_start_another_attempt(in_acme):
    run = start("chatter")
    epoch = engine.run_claim(run_id=run.id, owner="first", lease_seconds=-1)  # died
    scope = Scope(run.id, "0", epoch)
    with pytest.raises(EffectError):  # nothing listens there: the attempt fails, retryable
        effect_perform(scope=scope, name="ping", connector="test_keyed",
                       args={"url": "http://127.0.0.1:9/nowhere"})
    assert Effect.objects.get(run=run, name="ping").attempts == 1
    assert engine.run_claim(run_id=run.id, owner="second")  # the first one is a zombie now
    with pytest.raises(engine.LeaseLost):
        effect_perform(scope=scope, name="ping", connector="test_keyed",
                       args={"url": "http://127.0.0.1:9/nowhere"})
    assert Effect.objects.get(run=run, name="ping").attempts == 1  # it started nothing


def test_a_worker_without_the_agent_version_hands_the_run_back_for_later(in_acme):
    run = start("rollout")
    Run.objects.filter(id=run.id).update(agent_version=99)
    assert advanced(run.id) == engine.Outcome.DEFERRED
    run.refresh_from_db()
    assert run.status == "queued" and run.claims_without_checkpoint == 0  # not a poison claim
    row = ReadyRun.objects.get(run_id=run.id, branch=-1)
    assert row.dispatched_at is None and row.deferred_since is not None
    assert row.ready_at > row.deferred_since  # later, for a worker that has it
    assert "agent_unknown_here" in kinds(run) and "resume_refused" not in kinds(run)


def test_after_the_grace_period_a_run_nobody_can_run_is_parked(in_acme, settings):
    settings.RUN_UNKNOWN_AGENT_GRACE_SECONDS = 0
    run = start("rollout")
    Run.objects.filter(id=run.id).update(agent_version=99)
    assert advanced(run.id) == engine.Outcome.DEFERRED  # first time: in grace
    ReadyRun.objects.filter(run_id=run.id).update(ready_at=ReadyRun.objects.get(
        run_id=run.id).deferred_since)
    assert advanced(run.id) == engine.Outcome.PARKED
    run.refresh_from_db()
    assert run.status == "waiting" and "version 99 is not registered" in run.waiting_reason
    assert not ReadyRun.objects.filter(run_id=run.id).exists()


def test_async_mode_holds_at_most_the_configured_writes_in_flight(in_acme, settings):
    settings.RUN_ASYNC_MAX_PENDING_WRITES = 2
    run = start("chatter", durability="async")
    epoch = engine.run_claim(run_id=run.id, owner="writer")
    run.refresh_from_db()
    writer = engine.CheckpointWriter(run, epoch)
    handed = []

    def step_loop():
        for visit in range(1, 6):
            writer.write(engine.Position(visit=visit, step="talk", state={}, offsets={}))
            handed.append(visit)

    db = settings.DATABASES["default"]
    with psycopg.connect(host=db["HOST"] or "127.0.0.1", port=db["PORT"] or 5432,
                         user=db["USER"] or "postgres", dbname=db["NAME"]) as blocker:
        blocker.execute(f'SELECT 1 FROM "{connection.schema_name}".runs_run WHERE id = %s '
                        "FOR UPDATE", [run.id])  # every checkpoint write waits on this lock
        loop = threading.Thread(target=step_loop)
        loop.start()
        loop.join(timeout=2)
        assert loop.is_alive() and handed == [1, 2]  # the third write waits for the first
        blocker.rollback()
    loop.join(timeout=30)
    writer.flush()
    writer.close()
    assert handed == [1, 2, 3, 4, 5]
    assert sorted(run.checkpoints.values_list("visit", flat=True)) == [0, 1, 2, 3, 4, 5]


def test_a_requeued_run_is_not_handed_out_before_its_ready_time(in_acme):
    run = start("chatter")
    ready_defer(run_id=run.id, delay_seconds=3600)
    dispatch_ready()
    assert ReadyRun.objects.get(run_id=run.id).dispatched_at is None
    assert RunEvent.objects.filter(run=run).count() == 1


@pytest.mark.parametrize("how", ["nan_state", "nul_state", "nul_key", "surrogate_log",
                                 "nul_in_tuple", "deep_state", "object_log", "inf_result",
                                 "nan_notify", "nul_by_str", "long_notify_name",
                                 "long_event_key", "deep_result", "nan_effect"])
def test_a_step_returning_what_cannot_be_stored_fails_in_words(in_acme, how):
    """jsonb and text refuse NaN, U+0000, lone surrogates: the step fails cleanly at once, not
    by a DataError at the write, which would retry the run until it is parked as poison."""
    run = finished(start("unstorable", input={"how": how}).id)
    assert run.status == "failed", (run.status, run.waiting_reason)
    assert "cannot be stored" in run.error or "at most" in run.error
    assert run.claims_without_checkpoint == 0
    assert RunEvent.objects.get(run=run, kind="step_failed").data["step"] == "produce"
    assert OutboxMessage.objects.filter(run=run).count() == 0


@pytest.mark.parametrize("how", ["fail_number", "approval_list", "deciders_text", "huge_timeout",
                                 "timeout_number", "naive_sleep", "far_sleep", "child_list",
                                 "ancient_sleep", "ancient_since", "negative_timeout",
                                 "bare_sleep", "goto_list", "deciders_dicts", "wide_fan_out"])
def test_a_transition_with_a_field_of_the_wrong_type_fails_the_run_in_words(in_acme, how):
    """Not an engine error that parks the run for an operator: the step's own mistake."""
    run = finished(start("unstorable", input={"how": how}).id)
    assert run.status == "failed", (run.status, run.waiting_reason)
    assert run.error.startswith("step 'produce' returned "), run.error
    assert RunEvent.objects.get(run=run, kind="step_failed").data["step"] == "produce"
    assert not RunEvent.objects.filter(run=run, kind="engine_error").exists()


def test_a_branch_returning_a_field_of_the_wrong_type_fails_and_the_join_runs(in_acme):
    run = start("unstorable", input={"how": "fail_number_branch"})
    assert advanced(run.id) == engine.Outcome.PARKED
    branch = Branch.objects.get(run=run)
    assert engine.branch_advance(run_id=run.id, index=0) == engine.Outcome.ENDED
    branch.refresh_from_db()
    assert branch.status == "failed" and "with a int as its reason" in branch.error, branch.error
    assert finished(run.id).result == [[False, branch.error]]


def test_a_long_fail_reason_is_kept_cut_to_its_limit(in_acme):
    run = finished(start("unstorable", input={"how": "long_reason"}).id)
    assert run.status == "failed"
    assert run.error.startswith("a:a:") and run.error.endswith("91808 more characters not kept)")
    assert len(run.error) < ERROR_MAX_CHARS + 100


def test_a_step_returning_more_than_the_transition_limit_fails_in_words(in_acme):
    run = finished(start("unstorable", input={"how": "huge_append"}).id)
    assert run.status == "failed", (run.status, run.waiting_reason)
    assert "over the 8388608-byte limit" in run.error, run.error
    assert not LogEntry.objects.filter(run=run).exists()


def test_storable_values_that_look_like_the_refused_ones_are_kept(in_acme):
    run = finished(start("unstorable", input={"how": "fine"}).id)
    assert run.status == "succeeded", run.error
    assert run.result == {"x": "😀 \\u0000 \\ud800 😀", "notes": ["😀", "\\u0000"]}


def test_a_reason_holding_a_nul_is_kept_readable(in_acme):
    run = finished(start("unstorable", input={"how": "nul_reason"}).id)
    assert (run.status, run.error) == ("failed", "bad\ufffdreason")


def test_an_exception_message_holding_a_nul_is_recorded(in_acme):
    run = finished(start("unstorable", input={"how": "nul_error"}).id)
    assert run.status == "failed" and "bad \ufffd byte" in run.error
    errors = RunEvent.objects.filter(run=run, kind="step_error").order_by("id")
    assert [e.data["error"] for e in errors] == [run.error] * 2


def test_a_branch_returning_what_cannot_be_stored_fails_and_the_join_runs(in_acme):
    run = start("unstorable", input={"how": "nan_branch"})
    assert advanced(run.id) == engine.Outcome.PARKED
    assert engine.branch_advance(run_id=run.id, index=0) == engine.Outcome.ENDED
    run = finished(run.id)
    assert run.status == "succeeded"
    [[ok, error]] = run.result
    assert not ok and "cannot be stored" in error and "bad_branch" in error
