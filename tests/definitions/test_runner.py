"""The runner, in this process: tool calls through the ledger, approvals (always, by rule,
rejected, edited), waits for events and their timeouts, limits, fan-outs, bounded storage."""

import json

import pytest
from django.utils import timezone

from integrations.models import Credential
from integrations.services import credential_set
from runs import engine
from runs.approvals.models import Approval
from runs.approvals.services import approval_decide, event_deliver, wakeup_fire
from runs.definitions.runner import MAX_ARGUMENT_CHARS, MESSAGES
from runs.dispatch.models import Wakeup
from runs.effects.models import Effect
from runs.models import Branch, Checkpoint, LogEntry
from tests.support.fakes.fixtures import smtp_server  # noqa: F401
from tests.support.fakes.smtp import free_port
from tests.support.runs import finished, kinds, start
from tests.support.waiting import wait_for

from .conftest import POST, define


def messages(run) -> list[dict]:
    return list(LogEntry.objects.filter(run=run, log=MESSAGES).order_by("index")
                .values_list("value", flat=True))


def tool_results(run) -> list[dict]:
    return [json.loads(m["content"]) for m in messages(run) if m["role"] == "tool"]


def post(url: str, **payload) -> dict:
    return {"name": "post", "arguments": {"url": url, "payload": payload}}


def test_an_always_tool_parks_and_runs_with_the_arguments_a_person_edited(model, webhook):
    a = define("notifier", tools=[{**POST, "approval": "always"}])
    model.script({a: [{"tool_calls": [post("{{input.url}}", text="draft")]},
                      {"content": "posted: {{tool.post.body.received}}"}]})
    run = finished(start(a, input={"url": webhook.url + "/hook"}).id)
    assert run.status == "waiting" and webhook.state()["deliveries"] == 0
    approval = Approval.objects.get(run=run, status="pending")
    assert approval.request["artifact"] == {"url": webhook.url + "/hook", "payload": {"text": "draft"}}
    approval_decide(approval_id=approval.id, approve=True, by="user:ann@acme.test",
                    artifact={"url": webhook.url + "/hook", "payload": {"text": "edited"}})
    run = finished(run.id)
    assert run.status == "succeeded", run.error
    assert list(webhook.events.values()) == [{"text": "edited"}]
    assert run.result["content"] == "posted: true"
    assert model.state()["by_turn"] == {f"{a}:0": 1, f"{a}:1": 1}


def test_an_edited_artifact_that_breaks_the_tool_parameters_is_not_run_and_the_model_is_told(
        model, webhook):
    a = define("notifier", tools=[{**POST, "approval": "always"}])
    model.script({a: [{"tool_calls": [post("{{input.url}}", text="draft")]},
                      {"content": "{{tool.post.error}}"}]})
    run = finished(start(a, input={"url": webhook.url + "/hook"}).id)
    approval = Approval.objects.get(run=run, status="pending")
    approval_decide(approval_id=approval.id, approve=True, by="ann", artifact={"url": 7})
    run = finished(run.id)
    assert run.status == "succeeded" and webhook.state()["deliveries"] == 0
    assert "do not match the tool's parameters" in run.result["content"]
    assert "$.url" in run.result["content"] and "payload" in run.result["content"]


def test_a_rejected_call_is_not_made_and_the_model_reads_who_rejected_it(model, webhook):
    a = define("notifier", tools=[{**POST, "approval": "always"}])
    model.script({a: [{"tool_calls": [post("{{input.url}}", text="draft")]},
                      {"content": "{{tool.post.error}} / {{tool.post.comment}}"}]})
    run = finished(start(a, input={"url": webhook.url + "/hook"}).id)
    approval = Approval.objects.get(run=run, status="pending")
    approval_decide(approval_id=approval.id, approve=False, by="ann", comment="not today")
    run = finished(run.id)
    assert run.status == "succeeded" and webhook.state()["deliveries"] == 0
    assert run.result["content"] == "a person rejected this call; it was not made / not today"


@pytest.mark.parametrize("amount, asks", [(500, False), (501, True)])
def test_a_rule_asks_a_person_only_above_the_threshold(model, fake_stripe, amount, asks):
    credential_set(connector="payments", secrets={"secret_key": "sk_test_acme",
                                                  "api_url": fake_stripe.url})
    a = define("payer", tools=[{"name": "pay", "kind": "connector", "action": "payments.charge",
                            "approval": {"argument": "amount", "above": 500}}])
    model.script({a: [
        {"tool_calls": [{"name": "pay", "arguments": {"amount": "{{input.amount}}", "currency": "eur",
                                                      "customer": "cus_1"}}]},
        {"content": "charged {{tool.pay.amount}}"}]})
    run = finished(start(a, input={"amount": amount}).id)
    if asks:
        assert run.status == "waiting" and fake_stripe.state()["charges"] == 0
        approval = Approval.objects.get(run=run, status="pending")
        assert approval.request["artifact"]["amount"] == amount
        assert "amount above 500" in approval.request["body"]
        approval_decide(approval_id=approval.id, approve=True, by="ann")
        run = finished(run.id)
    else:
        assert not Approval.objects.filter(run=run).exists()
    assert run.status == "succeeded", run.error
    assert run.result["content"] == f"charged {amount}"
    assert fake_stripe.state()["charges"] == 1


def test_max_turns_stops_a_model_that_keeps_calling_tools(model, webhook):
    a = define("looper", tools=[POST], limits={"max_turns": 3})
    model.script({a: [{"tool_calls": [post("{{input.url}}", n=1)], "repeat": True}]})
    # the input is in the run's state too: it cannot reset the runner's counters
    run = finished(start(a, input={"url": webhook.url + "/hook", "turns": -100,
                                          "max_turns": 1000}).id)
    assert run.status == "failed"
    assert run.error.startswith("limit reached: max_turns (3)")
    assert model.requests(a) == 3 and webhook.state()["deliveries"] == 3
    assert run.max_steps > 3 * 3  # the turn limit bites first, with its own reason


def test_the_platform_default_limits_apply_when_a_definition_sets_none(model, settings):
    settings.AGENT_DEFAULT_LIMITS = {"max_turns": 2, "max_tokens": 12345}
    a = define("looper", tools=[POST])
    model.script({a: [{"tool_calls": [{"name": "post", "arguments": {}}], "repeat": True}]})
    run = start(a)
    assert run.max_tokens == 12345
    run = finished(run.id)
    assert run.error.startswith("limit reached: max_turns (2)")


def test_a_token_budget_refuses_the_turn_that_would_pass_it(model):
    a = define("talker", tools=[POST], limits={"max_tokens": 1000})  # a turn may use 1024
    model.script({a: [{"tool_calls": [{"name": "post", "arguments": {}}], "repeat": True}]})
    run = finished(start(a).id)
    assert run.status == "failed" and "token budget" in run.error
    assert model.requests(a) == 0


def test_wait_for_event_resumes_on_the_event_with_the_key_from_the_arguments(model):
    a = define("waiter", tools=[{"name": "await_payment", "kind": "wait_for_event",
                             "event": "invoice.paid", "key_argument": "invoice_id"}])
    model.script({a: [
        {"tool_calls": [{"name": "await_payment", "arguments": {"invoice_id": "{{input.invoice}}"}}]},
        {"content": "paid by {{tool.await_payment.payload.by}}"}]})
    run = finished(start(a, input={"invoice": "INV-7"}).id)
    assert run.status == "waiting"
    assert event_deliver(kind="invoice.paid", key="INV-8", payload={"by": "nobody"}).resumed == []
    assert event_deliver(kind="invoice.paid", key="INV-7", payload={"by": "bob"}).resumed == [run.id]
    run = finished(run.id)
    assert run.status == "succeeded", run.error
    assert run.result["content"] == "paid by bob"
    assert Checkpoint.objects.filter(run=run).latest("visit").state.get("event") is None


def _time_out(run):
    Wakeup.objects.filter(run_id=run.id).update(due_at=timezone.now())
    visit = Wakeup.objects.get(run_id=run.id).visit
    assert wakeup_fire(run_id=run.id, visit=visit) == "timed_out"
    return finished(run.id)


def test_an_event_wait_and_an_approval_wait_time_out_each_with_its_own_answer(model):
    a = define("asker", tools=[
        {"name": "await_reply", "kind": "wait_for_event", "event": "reply", "key_argument": "thread",
         "timeout_seconds": 3600},
        {"name": "ask", "kind": "wait_for_approval", "timeout_seconds": 3600}])
    model.script({a: [
        {"tool_calls": [{"name": "await_reply", "arguments": {"thread": "t1"}}]},
        {"tool_calls": [{"name": "ask", "arguments": {"question": "Ship it?"}}]},
        {"content": "{{tool.await_reply.error}} | {{tool.ask.error}} | {{tool.ask.approved}}"}]})
    run = finished(start(a).id)
    run = _time_out(run)  # the event
    assert run.status == "waiting" and Approval.objects.get(run=run).request["title"] == "Ship it?"
    run = _time_out(run)  # the approval
    assert run.status == "succeeded", run.error
    assert run.result["content"] == ("no such event arrived before the timeout | "
                                     "no person decided before the timeout | false")


def test_parallel_calls_of_resend_safe_tools_fan_out_and_each_receiver_sees_one(model, webhook):
    a = define("broadcaster", tools=[POST])
    model.script({a: [
        {"tool_calls": [post("{{input.url}}/a", n=1), post("{{input.url}}/b", n=2),
                        post("{{input.url}}/c", n=3)]},
        {"content": "done"}]})
    run = finished(start(a, input={"url": webhook.url}).id)
    assert run.status == "waiting" and "fan_out" in kinds(run)
    branches = list(Branch.objects.filter(run=run).order_by("index"))
    assert [b.item["arguments"]["payload"]["n"] for b in branches] == [1, 2, 3]
    for branch in branches:  # a worker this session started may take one first: it runs once
        assert engine.branch_advance(run_id=run.id, index=branch.index) in (
            engine.Outcome.ENDED, engine.Outcome.NOT_CLAIMED)
    wait_for(lambda: not Branch.objects.filter(run=run).exclude(status="done").exists(),
             what="every branch to be done")
    run = wait_for(lambda: (r := finished(run.id)).status in ("succeeded", "failed") and r,
                   what="the join to finish the run")
    assert run.status == "succeeded", run.error
    assert sorted(d["path"] for d in webhook.deliveries) == ["/a", "/b", "/c"]
    assert sorted(p["n"] for p in webhook.events.values()) == [1, 2, 3]
    results = [m for m in messages(run) if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in results] == ["call_0_0", "call_0_1", "call_0_2"]


def test_calls_of_a_receiver_that_ignores_keys_run_one_by_one_in_the_main_step(
        model, webhook, smtp_server):  # noqa: F811
    # email ignores idempotency keys: a lost outcome must park the run, which a branch cannot
    credential_set(connector="email", secrets={"host": "127.0.0.1", "port": smtp_server.port})
    a = define("mailer", tools=[{"name": "mail", "kind": "connector", "action": "email.send"}, POST])
    mail = {"name": "mail", "arguments": {"to": "a@example.com", "subject": "s", "body": "b"}}
    model.script({a: [{"tool_calls": [mail, mail, post("{{input.url}}", n=1)]},
                      {"content": "done"}]})
    run = finished(start(a, input={"url": webhook.url}).id)
    assert run.status == "succeeded", run.error
    assert "fan_out" not in kinds(run) and not Branch.objects.filter(run=run).exists()
    assert len(smtp_server.messages) == 2 and webhook.state()["deliveries"] == 1


def test_the_conversation_is_stored_once_and_the_state_stays_small(model, webhook):
    a = define("chatty", tools=[POST])
    model.script({a: [{"tool_calls": [post("{{input.url}}", n=i)]} for i in range(5)]
                  + [{"content": "done"}]})
    run = finished(start(a, input={"url": webhook.url}).id)
    assert run.status == "succeeded", run.error
    log = messages(run)
    assert len(log) == 1 + 5 * 2 + 1  # the input, 5 × (reply, result), the answer
    assert LogEntry.objects.filter(run=run).count() == len(log)  # each entry stored once
    turns = Effect.objects.filter(run=run, name="turn").order_by("id")
    assert turns.count() == 6
    for effect in turns:  # the conversation is not copied into each turn's effect
        assert set(effect.args["messages"]) == {"count", "sha256"}
    sizes = [len(json.dumps(c.state)) for c in Checkpoint.objects.filter(run=run).order_by("visit")]
    assert max(sizes) < 2_000, sizes


def test_oversized_and_unknown_calls_are_refused_with_a_reason_the_model_reads(model, webhook):
    a = define("sloppy", tools=[POST])
    model.script({a: [
        {"tool_calls": [{"name": "nope", "arguments": {}},
                        post("{{input.url}}", blob="x" * MAX_ARGUMENT_CHARS),
                        {"name": "post", "arguments": {"url": 3}}]},
        {"content": "done"}]})
    run = finished(start(a, input={"url": webhook.url}).id)
    assert run.status == "succeeded", run.error
    errors = [r["error"] for r in tool_results(run)]
    assert "no tool named 'nope'" in errors[0]
    assert "over the" in errors[1] and "not made" in errors[1]
    assert "$.url" in errors[2]
    assert webhook.state()["deliveries"] == 0


def test_a_sandbox_tool_runs_in_the_jail_and_its_workspace_persists_between_turns(model, s3):
    a = define("coder", tools=[{"name": "sh", "kind": "sandbox", "language": "bash"},
                               {"name": "count", "kind": "sandbox", "language": "python",
                                "command": "import json; a = json.load(open('.tool/arguments.json'));"
                                           " print(len(open(a['file']).read().split()))",
                                "parameters": {"type": "object", "required": ["file"],
                                               "properties": {"file": {"type": "string"}}}}])
    model.script({a: [
        {"tool_calls": [{"name": "sh", "arguments": {"script": "echo one two three > notes.txt; id -u"}}]},
        {"tool_calls": [{"name": "sh", "arguments": {"script": "cat notes.txt; ls /work 2>&1 | head -1"}}]},
        {"tool_calls": [{"name": "count", "arguments": {"file": "notes.txt"}}]},
        {"content": "{{tool.sh.stdout}}|{{tool.count.stdout}}"}]})
    run = finished(start(a).id)
    assert run.status == "succeeded", run.error
    first, second, counted = tool_results(run)
    assert first["exit_code"] == 0 and first["stdout"].strip() != "0"  # not root in the jail
    assert second["stdout"].startswith("one two three\n")  # the file from the turn before
    assert "No such file" in second["stdout"]  # the host's tree is not in the jail
    assert counted["stdout"].strip() == "3"


def test_a_tool_that_keeps_failing_unsent_is_an_answer_the_model_reads_not_a_failed_run(model, webhook):
    # Nothing listens: each try fails before anything is sent, so telling the model is safe.
    # (A failure after sending parks for a person: test_runner_dist.)
    a = define("poster", tools=[POST])
    model.script({a: [{"tool_calls": [post("{{input.url}}", n=1)]}, {"content": "{{tool.post.error}}"}]})
    run = finished(start(a, input={"url": f"http://127.0.0.1:{free_port()}"}).id)
    assert run.status == "succeeded", run.error
    assert run.result["content"].startswith("the call failed, 3 attempts:")
    assert "outcome_unknown" not in messages(run)[-2]["content"]


def test_a_credential_removed_after_the_definition_was_saved_is_said_so_not_called_without_it(
        model, webhook):
    credential_set(connector="webhook", label="hooks", secrets={"signing_secret": "whsec_test"})
    credential_set(connector="model", label="removable", secrets={"api_key": "sk-scripted",
                                                                  "base_url": model.base_url})
    a = define("poster", tools=[{**POST, "credential": "hooks"}])
    model.script({a: [{"tool_calls": [post("{{input.url}}", n=1)]}, {"content": "{{tool.post.error}}"}]})
    Credential.objects.filter(connector="webhook", label="hooks").delete()
    run = finished(start(a, input={"url": webhook.url}).id)
    assert run.status == "succeeded", run.error  # the model read why the call was not made
    assert run.result["content"] == ("the call was refused: this tenant has no 'webhook' credential "
                                     "labelled 'hooks' (was it removed?), so the call was not made")
    assert webhook.state()["deliveries"] == 0
    b = define("talker", tools=[], model={"name": "talker", "credential": "removable"})
    Credential.objects.filter(connector="model", label="removable").delete()
    run = finished(start(b, input={}).id)
    assert run.status == "failed"
    assert "this tenant has no 'model' credential labelled 'removable' (was it removed?)" in run.error
