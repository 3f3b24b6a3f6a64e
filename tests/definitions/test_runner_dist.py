"""Lost or doubled work in the runner, in this process: call ids that would name two calls'
effects alike, values PostgreSQL cannot store (a NUL in a model's reply or a receiver's answer)
that would have a recorded turn paid again on every retry, and a call whose outcome is unknown
after its retries, which the model must not read as "not made"."""

import json
from collections import OrderedDict

from django.db import connection

from integrations.connectors.webhook import WebhookConnector
from runs import engine
from runs.approvals.models import Approval
from runs.approvals.services import approval_decide, event_deliver
from runs.definitions import registry, runner
from runs.definitions.models import AgentDefinition
from runs.definitions.runner import _calls_read
from runs.definitions.services import definition_update
from runs.dispatch.models import ReadyRun
from runs.effects.models import Effect
from runs.effects.services import args_digest
from runs.models import LogEntry
from runs.services import run_migrate
from tests.support.runs import dispatcher_held, finished, start

from .conftest import POST, define


def raw(id: str, **arguments) -> dict:
    return {"id": id, "type": "function",
            "function": {"name": "post", "arguments": json.dumps(arguments)}}


def test_a_fallback_call_id_never_takes_an_id_the_model_gave_another_call_of_the_reply():
    # the second call has no id; its fallback ("call_1_1") is the first call's own id
    calls = _calls_read([raw("call_1_1", n=1), raw("", n=2), raw("call_1_1", n=3)], turn=1)
    ids = [call["id"] for call in calls]
    assert len(set(ids)) == 3, ids  # three calls, three effects ("tool:<id>")
    assert ids[0] == "call_1_1"
    # and the same reply read again (a step re-run) names them alike: effects stay stable
    assert [c["id"] for c in _calls_read([raw("call_1_1", n=1), raw("", n=2),
                                          raw("call_1_1", n=3)], turn=1)] == ids


def test_a_nul_in_the_models_reply_is_stored_and_the_turn_is_paid_once(model):
    a = define("nul", tools=[])
    model.script({a: [{"content": "before\u0000after"}]})
    run = finished(start(a, input={}).id)
    assert run.status == "succeeded", run.error
    assert run.result["content"] == "before\ufffdafter"
    assert model.state()["by_turn"] == {f"{a}:0": 1}
    assert run.tokens_used > 0  # the usage was recorded with the turn, so budgets see it


def test_a_call_whose_arguments_hold_a_nul_is_refused_with_a_reason_not_a_stuck_run(model, webhook):
    a = define("nularg", tools=[POST])
    model.script({a: [{"tool_calls": [{"name": "post", "arguments": {
        "url": "{{input.url}}", "payload": {"text": "a\u0000b"}}}]},
        {"content": "{{tool.post.error}}"}]})
    run = finished(start(a, input={"url": webhook.url + "/hook"}).id)
    assert run.status == "succeeded", run.error
    assert "U+0000" in run.result["content"]
    assert webhook.state()["deliveries"] == 0


def test_a_call_that_may_have_been_acted_on_parks_for_a_person_not_for_the_model(model, webhook):
    """The receiver acts, then the answer is lost, three times (one key: it acts once). Told
    "failed", a model calls again under a new id, a new key, and the receiver acts twice: the
    run parks instead, and a person's "not delivered" sends it again under its own key."""
    a = define("dropped", tools=[POST])
    model.script({a: [{"tool_calls": [{"name": "post", "arguments": {
        "url": "{{input.url}}", "payload": {"n": 1}}}]},
        {"content": "answered {{tool.post.status}}"}]})
    webhook.configure("drop_next", 3)
    run = finished(start(a, input={"url": webhook.url + "/hook"}).id)
    assert run.status == "waiting", run.error
    asked = Approval.objects.get(run=run, status="pending")
    assert asked.kind == "effect_outcome" and "may have reached the receiver" in asked.request["body"]
    effect = Effect.objects.get(run=run, name__startswith="tool:")
    assert (effect.status, effect.maybe_sent, effect.attempts) == ("unknown", True, 3)
    assert model.state()["requests"] == 1  # the model was not told, so it could not call again

    approval_decide(approval_id=asked.id, approve=False, by="ops")  # "it did not arrive": resend
    run = finished(run.id)
    assert run.status == "succeeded", run.error
    assert run.result["content"] == "answered 200"
    assert webhook.state()["acted"] == 1  # the resend carried the same key
    assert Effect.objects.get(id=effect.id).idempotency_key == effect.idempotency_key


def test_a_receivers_answer_with_a_nul_is_recorded_once(model, webhook, monkeypatch):
    """A hostile receiver's answer holding a NUL: recorded (replaced), never re-sent."""
    def execute(self, call):
        return {"status": 200, "body": {"text": "x\u0000y"}}

    monkeypatch.setattr(WebhookConnector, "execute", execute)
    a = define("nulbody", tools=[POST])
    model.script({a: [{"tool_calls": [{"name": "post", "arguments": {
        "url": "{{input.url}}", "payload": {"n": 1}}}]}, {"content": "{{tool.post.body.text}}"}]})
    run = finished(start(a, input={"url": webhook.url + "/hook"}).id)
    assert run.status == "succeeded", run.error
    assert run.result["content"] == "x\ufffdy"
    effect = Effect.objects.get(run=run, name__startswith="tool:")
    assert effect.attempts == 1 and effect.status == "done"
    assert LogEntry.objects.filter(run=run).count() == 4


def test_a_fan_out_branch_that_failed_is_answered_as_unknown(model, webhook, monkeypatch):
    """A branch that failed (here its connector breaks after sending; or its workers kept
    dying) may have reached the receiver: the model reads outcome_unknown, not just failed."""
    def execute(self, call):
        raise RuntimeError("the connection broke after the request went out")

    monkeypatch.setattr(WebhookConnector, "execute", execute)
    a = define("fanfail", tools=[POST])
    model.script({a: [{"tool_calls": [
        {"name": "post", "arguments": {"url": "{{input.url}}/a", "payload": {"n": 1}}},
        {"name": "post", "arguments": {"url": "{{input.url}}/b", "payload": {"n": 2}}}]},
        {"content": "{{tool.post.outcome_unknown}}"}]})
    with dispatcher_held():  # its branches run here, with the connector that breaks
        run = finished(start(a, input={"url": webhook.url}).id)
        ReadyRun.objects.filter(run_id=run.id).delete()
    assert run.status == "waiting"
    for index in (0, 1):
        assert engine.branch_advance(run_id=run.id, index=index, sleep=lambda s: None) == \
            engine.Outcome.ENDED
    run = finished(run.id)
    assert run.status == "succeeded", run.error
    assert run.result["content"] == "true"
    results = [json.loads(m["content"]) for m in LogEntry.objects.filter(run=run, log="messages")
               .order_by("index").values_list("value", flat=True) if m["role"] == "tool"]
    assert [r["outcome_unknown"] for r in results] == [True, True]


def test_a_waiting_run_across_a_runner_upgrade_is_refused_then_migrated_to_a_new_version(
        model, webhook, monkeypatch, settings):
    """RUNNER_VERSION is pinned with each definition version (Agent.pins): a deploy that bumps
    it refuses every unfinished run of a tenant agent at its next claim (the steps' meaning
    changed), with a reason that says what to do; a new version of the definition and a
    migrate carry the run on, its recorded effects intact (the webhook acted once)."""
    a = define("upgraded", tools=[{**POST, "approval": "always"}])
    model.script({a: [{"tool_calls": [{"name": "post", "arguments": {
        "url": "{{input.url}}", "payload": {"n": 1}}}]}, {"content": "done"}]})
    run = finished(start(a, input={"url": webhook.url + "/hook"}).id)
    assert run.status == "waiting"
    # The new deploy is this process only: the session's workers still run the old one, and
    # rightly refuse the migrated run (its version pins the new runner). Run it all here.
    settings.DISPATCH_LOCK_WAIT_SECONDS = 0.1  # a wake-up's dispatch gives up at once
    with dispatcher_held():
        monkeypatch.setattr(runner, "RUNNER_VERSION", runner.RUNNER_VERSION + 1)
        monkeypatch.setattr(registry, "_cache", OrderedDict())  # a fresh worker process
        approval_decide(approval_id=Approval.objects.get(run=run).id, approve=True, by="ann")
        run = finished(run.id)
        assert run.status == "waiting" and webhook.state()["deliveries"] == 0
        assert "runner" in run.waiting_reason and "migrate" in run.waiting_reason, \
            run.waiting_reason
        spec = AgentDefinition.objects.get(name=a, version=1).spec
        version = definition_update(name=a, spec={**spec, "description": "on the new runner"}
                                    ).version
        run_migrate(run_id=run.id, version=version, by="ann")
        run = finished(run.id)
        ReadyRun.objects.filter(run_id=run.id).delete()
    assert run.status == "succeeded", run.error
    assert webhook.state()["acted"] == 1


def test_an_event_that_arrives_while_an_earlier_call_of_the_reply_waits_still_wakes_its_wait(
        model):
    """One reply asks a person, then waits for an event; the event comes while the person
    decides. The wait began with the reply, not when its turn came: the event counts."""
    a = define("both", tools=[
        {"name": "ask", "kind": "wait_for_approval"},
        {"name": "await_payment", "kind": "wait_for_event", "event": "invoice.paid",
         "key_argument": "invoice_id"}])
    model.script({a: [
        {"tool_calls": [{"name": "ask", "arguments": {"question": "Send it?"}},
                        {"name": "await_payment", "arguments": {"invoice_id": "{{input.invoice}}"}}]},
        {"content": "{{tool.ask.approved}} / paid by {{tool.await_payment.payload.by}}"}]})
    invoice = f"INV-{a}"
    run = finished(start(a, input={"invoice": invoice}).id)
    assert run.status == "waiting"
    assert event_deliver(kind="invoice.paid", key=invoice, payload={"by": "bob"}).resumed == []
    # Run here, not by a session worker: a worker would take it on past "queued" to its end.
    with dispatcher_held():
        approval_decide(approval_id=Approval.objects.get(run=run).id, approve=True, by="ann")
        run = finished(run.id)  # parks on the event, which is there already: back in line
    assert run.status == "queued", (run.status, run.waiting_reason)
    run = finished(run.id)
    assert run.status == "succeeded", (run.status, run.waiting_reason)
    assert run.result["content"] == "true / paid by bob"


def test_a_calls_arguments_digest_the_same_before_and_after_the_database(in_acme):
    """A step right after the turn reads the calls from memory; a re-run after a crash reads
    them from jsonb. 1e16 comes back from jsonb as an integer, so the effect's digest changed
    (the re-run was refused: "already recorded with different arguments"), and NaN or 1e999
    could not be stored at all (every checkpoint failed)."""
    calls = _calls_read([raw("a", amount=1e16, small=1e-7, price=19.99, big=10**20),
                         {"id": "b", "function": {"name": "post", "arguments": '{"n": NaN}'}},
                         {"id": "c", "function": {"name": "post", "arguments": '{"n": 1e999}'}}],
                        turn=1)
    arguments = calls[0]["arguments"]
    with connection.cursor() as cursor:
        cursor.execute("SELECT %s::jsonb", [json.dumps(arguments)])
        (stored,) = cursor.fetchone()
    stored = json.loads(stored) if isinstance(stored, str) else stored
    assert args_digest(stored) == args_digest(arguments)
    assert arguments["amount"] == 10**16 and arguments["price"] == 19.99
    assert all("not a finite number" in call.get("unreadable", "") for call in calls[1:]), calls[1:]
