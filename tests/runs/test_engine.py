"""The engine core, driven in-process (no Celery): checkpoints, retries, limits, versions."""

import uuid
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.db.models.functions import Now
from django.db.utils import DatabaseError

from runs import engine
from runs.agents import Agent, registry
from runs.engine.claims import run_park_refused
from runs.engine.store import run_claim
from runs.models import Checkpoint, LogEntry, Run, RunEvent
from runs.services import RunError, checkpoint_state, run_cancel, run_fork, run_start
from runs.transitions import finish, goto
from tests.support.agents import ATTEMPTS
from tests.support.runs import advanced, finished, kinds, other_connection, start


def test_research_agent_appends_one_finding_per_iteration(in_acme):
    run = finished(start("research", input={"topic": "tides", "iterations": 4}).id)
    assert run.status == "succeeded", run.error
    assert run.result["findings"] == 4 and run.result["topic"] == "tides"
    assert LogEntry.objects.filter(run=run, log="findings").count() == 4
    assert kinds(run) == ["run_created", "run_succeeded"]


def test_research_agent_stops_when_its_budget_is_spent(in_acme):
    run = finished(start("research", input={"iterations": 50, "budget": 30,
                                            "cost_per_iteration": 10}).id)
    assert run.result["findings"] == 3 and run.result["spent"] == 30


def test_same_idempotency_key_returns_the_same_run(in_acme):
    key = f"order-{uuid.uuid4()}"
    first = run_start(agent="research", input={"topic": "a"}, idempotency_key=key, enqueue=False)
    again = run_start(agent="research", input={"topic": "a"}, idempotency_key=key, enqueue=False)
    assert first.created and not again.created and again.run.id == first.run.id
    assert Run.objects.filter(idempotency_key=key).count() == 1
    with pytest.raises(RunError) as refused:
        run_start(agent="research", input={"topic": "b"}, idempotency_key=key, enqueue=False)
    assert refused.value.code == "idempotency_key_reused"


def test_step_that_raises_then_succeeds_on_retry(in_acme):
    run = finished(start("flaky", input={"failures": 2}).id)
    assert run.status == "succeeded" and run.result == {"attempts": 3}
    errors = RunEvent.objects.filter(run=run, kind="step_error").order_by("id")
    assert [e.data["attempt"] for e in errors] == [1, 2]
    assert "upstream refused attempt 1" in errors[0].data["error"]
    assert "ConnectionError" in errors[0].data["traceback"]


def test_a_step_error_shows_only_the_steps_frames_to_the_tenant(in_acme, acme_api):
    run = finished(start("flaky", input={"failures": 1}).id)
    [error] = RunEvent.objects.filter(run=run, kind="step_error")
    shown = error.data["traceback"]
    assert shown.startswith("Traceback (most recent call last):")
    frames = [line for line in shown.splitlines() if line.lstrip().startswith('File "')]
    assert frames and "tests/support/agents.py" in frames[0] and ", in wobble" in frames[0]
    assert "runs/engine" not in shown and "harness.py" not in shown
    assert shown.rstrip().endswith("ConnectionError: upstream refused attempt 1")
    events = acme_api.get(f"/api/v1/runs/{run.id}/events").json()["results"]
    assert [e["data"]["traceback"] for e in events if e["kind"] == "step_error"] == [shown]


def test_step_that_keeps_raising_fails_the_run_with_the_exception_recorded(in_acme):
    run = finished(start("flaky", input={"failures": 5}).id)
    assert run.status == "failed" and "ConnectionError" in run.error
    assert ATTEMPTS[str(run.id)] == 3
    assert [e["will_retry"] for e in RunEvent.objects.filter(run=run, kind="step_error")
            .values_list("data", flat=True)] == [True, True, False]
    assert kinds(run)[-1] == "run_failed"
    assert Checkpoint.objects.filter(run=run).count() == 1  # nothing lost: visit 0 is intact


def test_max_steps_fails_the_run_with_the_reason_in_its_events(in_acme):
    run = finished(start("chatter", input={"steps": 100}, max_steps=10).id)
    assert run.status == "failed" and run.steps_taken == 10
    assert "max_steps" in run.error
    event = RunEvent.objects.get(run=run, kind="limit_exceeded")
    assert "max_steps reached: 10 of 10" in event.data["error"]


def test_max_wall_time_fails_the_run(in_acme):
    run = finished(start("slowpoke", input={"seconds": 0.05}, max_wall_seconds=0.2).id)
    assert run.status == "failed" and "max wall time" in run.error
    assert 0.2 <= run.active_seconds < 2


def test_resumed_run_continues_the_same_counters(in_acme):
    run = start("chatter", input={"steps": 100}, max_steps=7)
    advances = 0
    outcome = engine.Outcome.SLICE_USED
    while outcome == engine.Outcome.SLICE_USED:
        outcome = engine.advance(run_id=run.id, slice_seconds=0)  # one step per advance
        advances += 1
    run.refresh_from_db()
    assert advances == 8 and run.steps_taken == 7 and run.status == "failed"
    assert list(Checkpoint.objects.filter(run=run).order_by("visit")
                .values_list("visit", flat=True)) == list(range(8))


@pytest.mark.parametrize("table", ["runs_runevent", "runs_checkpoint", "runs_logentry"])
def test_append_only_trigger_refuses_update_and_delete(in_acme, table):
    run = finished(start("chatter", input={"steps": 2}).id)
    for statement in (f"UPDATE {table} SET run_id = run_id WHERE run_id = %s",
                      f"DELETE FROM {table} WHERE run_id = %s"):
        with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute(statement, [run.id])
    assert Checkpoint.objects.filter(run=run).count() == 4


def test_state_at_checkpoint_k_equals_what_the_run_had_after_step_k(in_acme):
    run = finished(start("chatter", input={"steps": 12}).id)
    for k in range(0, 13):
        snapshot = checkpoint_state(run_id=run.id, visit=k)
        assert snapshot["state"].get("said", 0) == k
        messages = snapshot["logs"].get("messages", [])
        assert [m["n"] for m in messages] == list(range(1, k + 1))
        assert snapshot["step"] == ("talk" if k < 12 else "done")
    assert checkpoint_state(run_id=run.id, visit=13)["step"] is None


def test_fork_from_a_middle_checkpoint_continues_and_leaves_the_original_untouched(in_acme):
    original = finished(start("research", input={"topic": "moss", "iterations": 6}).id)

    def fingerprint():
        return (list(Checkpoint.objects.filter(run=original).order_by("visit")
                     .values_list("visit", "step", "state")),
                list(LogEntry.objects.filter(run=original).order_by("index")
                     .values_list("index", "value")),
                Run.objects.filter(id=original.id).values("status", "result", "steps_taken")[0])

    before = fingerprint()
    fork = run_fork(run_id=original.id, visit=3, enqueue=False)
    assert fork.forked_from_id == original.id and fork.status == "queued"
    fork = finished(fork.id)
    assert fork.status == "succeeded"
    assert fork.result == original.result  # same path from the same point
    assert checkpoint_state(run_id=fork.id, visit=3)["state"] == \
        checkpoint_state(run_id=original.id, visit=3)["state"]
    assert LogEntry.objects.filter(run=fork).count() == 6
    assert fingerprint() == before


def test_fork_of_an_unfinished_run_is_refused(in_acme):
    run = start("research")
    with pytest.raises(RunError) as refused:
        run_fork(run_id=run.id, visit=0, enqueue=False)
    assert refused.value.code == "run_not_finished"


@pytest.fixture
def drift_agent():
    def define(version, steps):
        agent = Agent("drift", version=version)

        @agent.step(start=True, next=steps)
        def begin(ctx, state):
            return goto(steps[0])

        for name in steps:
            agent.step(next=[], name=name)(lambda ctx, state: finish("done"))
        return agent

    yield define
    for version in (1, 2):
        registry.unregister("drift", version)


def test_topology_mismatch_is_refused_and_the_run_stays_parked(in_acme, drift_agent):
    drift_agent(1, ["a"])
    run = start("drift")
    drift_agent(1, ["a", "b"])  # a deploy changed v1's steps without bumping the version
    assert advanced(run.id) == engine.Outcome.PARKED
    run.refresh_from_db()
    assert run.status == "waiting" and "changed its steps" in run.waiting_reason
    assert RunEvent.objects.filter(run=run, kind="resume_refused").exists()
    assert Checkpoint.objects.filter(run=run).count() == 1  # not misrouted: nothing ran
    assert advanced(run.id) == engine.Outcome.NOT_CLAIMED  # parked, not retried


def test_a_parked_runs_waiting_reason_is_redacted(in_acme, drift_agent):
    # an engine error's message is the exception's, which may quote a DSN or a signed URL
    drift_agent(1, ["a"])
    run = start("drift")
    epoch = run_claim(run_id=run.id, owner="test-worker")
    reason = ("engine error: OperationalError: cannot reach postgresql://app:S3cretPW@db.internal/x"
              "; fix and re-queue it from the console")
    assert run_park_refused(run=run, epoch=epoch, reason=reason) == engine.Outcome.PARKED
    run.refresh_from_db()
    assert run.status == "waiting" and "db.internal/x" in run.waiting_reason
    assert "S3cretPW" not in run.waiting_reason
    [event] = RunEvent.objects.filter(run=run, kind="resume_refused")
    assert "S3cretPW" not in str(event.data)


def test_new_version_registers_while_old_runs_drain(in_acme, drift_agent):
    drift_agent(1, ["a"])
    old = start("drift")
    drift_agent(2, ["b"])
    new = start("drift")
    assert (old.agent_version, new.agent_version) == (1, 2)
    assert finished(old.id).status == "succeeded"
    assert finished(new.id).status == "succeeded"


@pytest.mark.parametrize("how,message", [
    ("undeclared", "does not declare"),
    ("too_big", "field 'notes'"),
    ("not_a_transition", "not a transition"),
    ("fails", "the agent gave up"),
])
def test_a_step_breaking_the_rules_fails_the_run_with_a_clear_error(in_acme, how, message):
    run = finished(start("rulebreaker", input={"how": how}).id)
    assert run.status == "failed" and message in run.error


def test_small_state_limit_is_configurable(in_acme, settings):
    settings.RUN_STATE_MAX_BYTES = 100
    with pytest.raises(RunError, match="field 'topic'"):
        start("research", input={"topic": "z" * 200})


@pytest.mark.parametrize("durability", ["sync", "async", "exit"])
def test_every_durability_mode_ends_in_the_same_state(in_acme, durability):
    run = finished(start("chatter", input={"steps": 30}, durability=durability).id)
    assert run.status == "succeeded" and run.result == {"said": 30, "messages": 30}
    visits = list(Checkpoint.objects.filter(run=run).values_list("visit", flat=True))
    assert sorted(visits) == (list(range(32)) if durability != "exit" else [0, 31])


def test_cancel_of_a_queued_run_is_immediate(in_acme):
    run = run_cancel(run_id=start("research").id)
    assert run.status == "cancelled"
    assert advanced(run.id) == engine.Outcome.NOT_CLAIMED
    with pytest.raises(RunError):
        run_cancel(run_id=run.id)


def test_worker_that_lost_its_lease_stops_at_its_next_write(in_acme):
    run = start("chatter", input={"steps": 5})
    stale_epoch = engine.run_claim(run_id=run.id, owner="stale")
    # as if the lease expired
    Run.objects.filter(id=run.id).update(lease_expires_at=Now() - timedelta(seconds=1))
    assert engine.advance(run_id=run.id, owner="successor") == engine.Outcome.ENDED
    stale = engine.Harness(Run.objects.get(id=run.id), registry.get("chatter"), stale_epoch,
                           "stale", slice_seconds=60)
    stale.run.status = "running"
    with pytest.raises(engine.LeaseLost):
        engine.checkpoint_commit(run=stale.run, epoch=stale_epoch,
                                 position=engine.Position(99, "talk", {}, {}))
    assert not Checkpoint.objects.filter(run=run, visit=99).exists()
    assert Run.objects.get(id=run.id).status == "succeeded"


def test_on_leave_is_called_last_in_the_transaction_in_which_the_run_ends(in_acme):
    """A worker hands its freed slot out there (runs/tasks.py): the run's end and the hand-out
    commit together, in one transaction."""
    run = start("research", input={"topic": "tides", "iterations": 2})
    seen = []

    def on_leave():
        with other_connection() as other:  # what is committed: not the end, yet
            committed = other.execute(
                f'SELECT status FROM "{connection.schema_name}".runs_run WHERE id = %s',
                [run.id]).fetchone()[0]
        seen.append((connection.in_atomic_block, Run.objects.get(id=run.id).status, committed))

    assert engine.advance(run_id=run.id, on_leave=on_leave) == engine.Outcome.ENDED
    assert seen == [(True, "succeeded", "running")]
    assert Run.objects.get(id=run.id).status == "succeeded"


# Every JSON value a log may hold, the falsy ones and nulls among them: they travel to the
# checkpoint statement in one JSON document, where a JSON null must not become SQL NULL.
ODD_VALUES = [None, {"a": None}, [None], 0, "", [], {}, False, "\u00e9\u2603", 1.5]


@pytest.fixture
def nulls_agent():
    agent = Agent("nulls", version=1, logs=["odd"])

    @agent.step(start=True, next=["again"])
    def first(ctx, state):
        return goto("again", append={"odd": ODD_VALUES[:5]})

    @agent.step(next=[])
    def again(ctx, state):
        return finish(list(state.log("odd")), append={"odd": ODD_VALUES[5:]})

    yield agent
    registry.unregister("nulls", 1)


ONE_A_STEP = ODD_VALUES + ['a "quoted" \\ back\\slash\n', "%s %(x)s $1", "x" * 20_000]


@pytest.fixture
def one_value_agent():
    """Appends one value a step: the checkpoint statement's one-entry form (in sync and async
    durability; exit mode writes them all at the end, as many)."""
    agent = Agent("one_value", version=1, logs=["odd"])

    @agent.step(start=True, next=["add"])
    def add(ctx, state):
        n = state.get("n", 0)
        if n == len(ONE_A_STEP):
            return finish(list(state.log("odd")))
        return goto("add", update={"n": n + 1}, append={"odd": [ONE_A_STEP[n]]})

    yield agent
    registry.unregister("one_value", 1)


@pytest.mark.parametrize("durability", ["sync", "async", "exit"])
def test_log_values_appended_one_a_step_are_stored_and_read_back_as_they_were(
        in_acme, one_value_agent, durability):
    run = finished(start("one_value", durability=durability).id)
    assert run.status == "succeeded", run.error
    assert run.result == ONE_A_STEP
    stored = LogEntry.objects.filter(run=run, log="odd").order_by("index")
    assert [(entry.index, entry.visit, entry.value) for entry in stored] == [
        (n, n + 1, value) for n, value in enumerate(ONE_A_STEP)]


@pytest.mark.parametrize("durability", ["sync", "async", "exit"])
def test_log_values_that_are_null_or_falsy_are_stored_and_read_back_as_they_were(
        in_acme, nulls_agent, durability):
    run = finished(start("nulls", durability=durability).id)
    assert run.status == "succeeded", run.error
    assert run.result == ODD_VALUES[:5]
    stored = LogEntry.objects.filter(run=run, log="odd").order_by("index")
    assert [entry.value for entry in stored] == ODD_VALUES
