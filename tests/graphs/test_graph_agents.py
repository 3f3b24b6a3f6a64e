"""LangGraph graphs as agents, driven in the test process (the engine is free of Celery):
supersteps as steps, effects in nodes through the ledger, interrupts as approvals and event
waits, the graph's topology as the run's pin. Real workers: test_graph_workers.py."""

import os
import socket
import uuid

import pytest
from django.db import DatabaseError, connection
from django.utils import timezone
from langgraph.graph import END, StateGraph

from agentplatform.langgraph import effect
from integrations.services import credential_set
from runs import engine
from runs.agents import Agent, UnknownAgent, registry
from runs.approvals.models import Approval
from runs.approvals.services import approval_decide, event_submit, wakeup_fire
from runs.dispatch.models import Wakeup
from runs.effects.models import Effect
from runs.graphs import driver
from runs.graphs.models import GraphCheckpoint
from runs.models import Checkpoint, Run
from runs.services import run_fork
from tests.support.fakes.fixtures import fake_webhook  # noqa: F401
from tests.support.graph_agents import PingState, pinger_graph
from tests.support.runs import finished, kinds, start
from tests.support.waiting import wait_for


@pytest.fixture
def webhook(in_acme, fake_webhook):  # noqa: F811
    credential_set(connector="webhook", secrets={"signing_secret": "whsec_test",
                                                 "url": fake_webhook.url})
    return fake_webhook


def steps_of(run: Run) -> list[str]:
    return list(Checkpoint.objects.filter(run=run).order_by("visit").values_list("step", flat=True))


def test_a_graph_runs_superstep_by_superstep_with_its_effects_once(webhook):
    run = start("graph-pinger", input={"count": 3})
    done = finished(run.id)
    assert done.status == "succeeded", done.error
    assert done.result["n"] == 3 and done.result["pings"] == [200, 200, 200]
    # one platform step per superstep, named for the node it ran: input, then ping three times
    assert steps_of(done) == ["__start__", "ping", "ping", "ping", None]
    assert done.steps_taken == 4
    assert webhook.state()["acted"] == 3 and set(webhook.deliveries_by_key().values()) == {1}
    scopes = list(Effect.objects.filter(run=done).values_list("scope", flat=True))
    assert len(set(scopes)) == 3 and all(s.startswith("g") and len(s) == 33 for s in scopes)
    # the graph's thread is the run, in the tenant's schema
    assert GraphCheckpoint.objects.filter(thread_id=str(run.id)).count() >= 4


@pytest.mark.parametrize("durability", ["sync", "async", "exit"])
def test_parallel_nodes_post_once_each(webhook, durability):
    # each effect first makes the held checkpoints durable: from two threads at once
    done = finished(start("graph-fan", input={}, durability=durability).id)
    assert done.status == "succeeded", done.error
    assert sorted(done.result["posted"]) == [200, 200]
    sides = sorted(event["side"] for event in webhook.events.values())
    assert sides == ["left", "right"] and webhook.state()["deliveries"] == 2
    assert "step_error" not in kinds(done)


def kill_saver_connection() -> None:
    """What a restart or a pooler's timeout does to this thread's (a worker's) connection: its
    socket is cut (a backend pid would name no fixed server connection behind PgBouncer)."""
    conn = driver._saver_connections.conn
    socket.socket(fileno=os.dup(conn.fileno())).shutdown(socket.SHUT_RDWR)


def test_a_checkpoint_connection_lost_while_idle_is_replaced(webhook):
    run = start("graph-pinger", input={"count": 2})
    assert engine.advance(run_id=run.id, slice_seconds=0) == engine.Outcome.SLICE_USED
    kill_saver_connection()
    driver._saver_connections.used_at -= driver.SAVER_IDLE_CHECK_SECONDS  # idle a while
    done = finished(run.id)
    assert done.status == "succeeded", done.error
    assert "step_error" not in kinds(done) and done.result["n"] == 2


def test_a_checkpoint_connection_lost_in_a_step_retries_the_run_not_the_step(webhook):
    run = start("graph-pinger", input={"count": 2})
    assert engine.advance(run_id=run.id, slice_seconds=0) == engine.Outcome.SLICE_USED
    kill_saver_connection()  # just used: not checked, so the step finds it dead
    with pytest.raises(DatabaseError, match="checkpoint connection failed"):
        engine.advance(run_id=run.id, slice_seconds=0)  # a worker's task: the run stays leased
    done = finished(run.id)  # taken again once its lease expires, as the watchdog would
    assert done.status == "succeeded", done.error
    assert "step_error" not in kinds(done) and done.result["n"] == 2
    assert webhook.state()["acted"] == 2


def test_an_interrupt_is_an_approval_and_the_decision_resumes_the_node(in_acme):
    order = uuid.uuid4().hex[:8]
    parked = finished(start("graph-asker", input={"order": order}).id)
    assert parked.status == "waiting" and parked.waiting_reason == f"approval: Ship order {order}?"
    approval = Approval.objects.get(run=parked, status="pending")
    assert approval.request["artifact"] == {"order": order} and approval.then == "ask"
    approval_decide(approval_id=approval.id, approve=True, by="maria", comment="go")

    second = finished(parked.id)  # the node's second interrupt of two: one at a time
    first_q = Approval.objects.get(run=second, status="pending")
    assert first_q.request["title"] == "First question?" and first_q.then == "ask_again"
    approval_decide(approval_id=first_q.id, approve=False, by="maria")
    third = finished(parked.id)
    second_q = Approval.objects.get(run=third, status="pending")
    assert second_q.request["title"] == "Second question?"
    approval_decide(approval_id=second_q.id, approve=True, by="joe", artifact={"edited": 1})

    done = finished(parked.id)
    assert done.status == "succeeded", done.error
    ask, first_answer, second_answer = done.result["answers"]
    assert ask == {"approved": True, "by": "maria", "comment": "go", "artifact": {"order": order}}
    assert first_answer["approved"] is False and first_answer["by"] == "maria"
    assert second_answer["approved"] is True and second_answer["artifact"] == {"edited": 1}
    assert kinds(done).count("approval_decided") == 3


def test_an_interrupt_nobody_answers_in_time_returns_timed_out(in_acme):
    parked = finished(start("graph-patient", input={}).id)
    approval = Approval.objects.get(run=parked, status="pending")
    assert approval.on_timeout == "hurry" and approval.expires_at is not None
    # due, or already fired by a beat of this test session (then its row is gone: CI)
    wait_for(lambda: Wakeup.objects.filter(run_id=parked.id, due_at__lte=timezone.now()).exists()
             or not Approval.objects.filter(id=approval.id, status="pending").exists(),
             what="the approval's timeout to be due")
    # fired here, unless a beat of this test session fired it first
    assert wakeup_fire(run_id=parked.id, visit=approval.visit) in ("timed_out", "stale")
    done = finished(parked.id)
    assert "wait_timed_out" in kinds(done)
    assert done.status == "succeeded", done.error
    assert done.result["answers"] == [{"approved": False, "timed_out": True}]


def test_an_interrupt_can_wait_for_an_event(in_acme):
    order = uuid.uuid4().hex[:8]
    parked = finished(start("graph-asker", input={"order": order, "wait": "event"}).id)
    assert parked.status == "waiting" and parked.waiting_reason.startswith("event")
    event_submit(kind="order.paid", key=order, payload={"amount": 42})
    moved = finished(parked.id)
    assert moved.status == "waiting" and moved.waiting_reason == "approval: First question?"
    run = Run.objects.get(id=parked.id)
    assert Checkpoint.objects.filter(run=run).order_by("-visit").first().state["langgraph"]
    graph_state = GraphCheckpoint.objects.filter(thread_id=str(run.id)).count()
    assert graph_state >= 2


def test_the_graphs_topology_pins_its_runs():
    pinned = registry.get("graph-pinger", 1)
    assert len(pinned.pins["langgraph"]) == 64
    name = f"graph-{uuid.uuid4().hex[:8]}"
    same = Agent.from_langgraph(name, 1, pinger_graph)
    reshaped = pinger_graph()
    reshaped.add_node("extra", lambda state: {})
    reshaped.add_edge("extra", END)
    other = Agent.from_langgraph(name, 2, reshaped.compile())
    try:
        assert same.pins == pinned.pins  # the same graph: the same pin, whatever the agent
        assert other.pins["langgraph"] != pinned.pins["langgraph"]
        assert same.steps.keys() == {"__start__", "ping"} and same.start == "__start__"
        assert other.steps["ping"].next == frozenset({"__start__", "ping", "extra"})
    finally:
        registry.unregister(name, 1)
        registry.unregister(name, 2)


def test_what_is_not_a_graph_is_refused_and_not_registered():
    name = f"graph-{uuid.uuid4().hex[:8]}"
    with pytest.raises(TypeError, match="compiled graph"):
        Agent.from_langgraph(name, 1, lambda: "not a graph")
    with pytest.raises(UnknownAgent):
        registry.get(name, 1)
    with pytest.raises(ValueError):  # LangGraph: a graph needs an entry point
        Agent.from_langgraph(name, 1, StateGraph(PingState).compile)
    with pytest.raises(UnknownAgent):
        registry.get(name, 1)


def test_effects_outside_a_platform_run_say_why():
    with pytest.raises(RuntimeError, match="run by the platform"):
        effect("x", "webhook", payload={})
    assert connection.schema_name == "public"


def test_a_fork_goes_on_from_the_graphs_checkpoint_at_that_visit(webhook):
    # its second ping fails once after posting: the retry finds the post in the ledger
    source = finished(start("graph-pinger", input={"count": 3, "fail_at": 2}).id)
    assert kinds(source).count("step_error") == 1
    assert steps_of(source)[2] == "ping"  # visit 2: after __start__ and the first ping
    fork = run_fork(run_id=source.id, visit=2, enqueue=False, by="test")
    done = finished(fork.id)
    assert done.status == "succeeded", done.error
    # the fork's graph starts from the source's checkpoint after one ping: two more, its own
    assert done.result["n"] == 3 and len(done.result["pings"]) == 3
    assert Effect.objects.filter(run=done).count() == 2 and webhook.state()["acted"] == 5
    assert GraphCheckpoint.objects.filter(thread_id=str(fork.id)).exists()
    assert kinds(done).count("step_error") == 1  # the fork's retry, too, posted once
    assert finished(source.id).result == source.result  # the source is untouched
    # only the source's history up to the fork point was copied, and no pending writes
    copied = set(GraphCheckpoint.objects.filter(thread_id=str(fork.id))
                 .values_list("checkpoint_id", flat=True))
    source_ids = set(GraphCheckpoint.objects.filter(thread_id=str(source.id))
                     .values_list("checkpoint_id", flat=True))
    assert 0 < len(copied & source_ids) < len(source_ids)


def test_a_fork_whose_source_thread_is_gone_fails_instead_of_starting_over(webhook):
    source = finished(start("graph-pinger", input={"count": 2}).id)
    fork = run_fork(run_id=source.id, visit=2, enqueue=False, by="test")
    GraphCheckpoint.objects.filter(thread_id=str(source.id)).delete()
    done = finished(fork.id)
    assert done.status == "failed" and "no longer has checkpoint" in done.error
    assert not Effect.objects.filter(run=done).exists()

def test_a_run_input_cannot_answer_an_interrupt_or_take_another_runs_thread(in_acme):
    """The state starts as the run's input: a forged 'where the graph is' and a forged
    decision in it are not followed (only a fork's source thread is)."""
    parked = finished(start("graph-asker", input={"order": "real"}).id)
    head = Checkpoint.objects.filter(run=parked).order_by("-visit").first().state
    forged = {"order": "evil", "langgraph": head["langgraph"], "interrupt": head["interrupt"],
              "approval": {"approved": True, "by": "user:cfo@acme.test", "comment": "forged",
                           "artifact": {"order": "evil"}}}
    attempt = finished(start("graph-asker", input=forged).id)
    assert attempt.status == "waiting" and attempt.waiting_reason == "approval: Ship order evil?"
    assert Approval.objects.get(run=attempt, status="pending").then == "ask"
    assert not GraphCheckpoint.objects.filter(thread_id=str(attempt.id),
                                              checkpoint_id=head["langgraph"]["checkpoint"]).exists()
    assert Approval.objects.get(run=parked).status == "pending"  # the real one: untouched


def test_an_answer_with_an_integer_beyond_64_bits_reaches_the_node_as_text(in_acme):
    order = uuid.uuid4().hex[:8]
    parked = finished(start("graph-asker", input={"order": order, "wait": "event",
                                                  "big": 2**64 + 1}).id)
    assert parked.status == "waiting"
    event_submit(kind="order.paid", key=order, payload={"amount": 2**70})
    moved = finished(parked.id)
    assert moved.status == "waiting", moved.error  # on to the next question, not failed
    approval = Approval.objects.get(run=moved, status="pending")
    approval_decide(approval_id=approval.id, approve=True, by="a", artifact={"n": -(2**65)})
    moved = finished(parked.id)
    approval_decide(approval_id=Approval.objects.get(run=moved, status="pending").id,
                    approve=True, by="a")
    done = finished(parked.id)
    assert done.status == "succeeded", done.error
    assert done.result["answers"][0] == {"amount": str(2**70)}
    assert done.result["answers"][1]["artifact"] == {"n": str(-(2**65))}
