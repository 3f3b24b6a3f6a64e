"""A tenant's agent on real worker processes, killed (SIGKILL) mid-turn: while the model call is
in flight, and after the model's reply is recorded but before its tool calls ran. Counted at the
scripted model server and at each receiver: nothing acts twice, and no recorded turn is paid
for twice."""

from integrations.services import credential_set
from runs.approvals.models import Approval
from runs.approvals.services import approval_decide
from runs.effects.models import Effect
from runs.models import Run
from runs.services import run_start
from tests.support.fakes.fixtures import smtp_server  # noqa: F401
from tests.support.waiting import wait_for

from .conftest import POST, define


def holder(run_id, workers):
    """The worker process that holds the run's lease now."""
    owner = wait_for(lambda: Run.objects.filter(id=run_id).exclude(lease_owner="")
                     .values_list("lease_owner", flat=True).first(), what="a lease holder")
    pid = int(owner.rsplit(":", 1)[1])
    return next(w for w in workers if pid in w.pids())


def post(n: int) -> dict:
    return {"name": "post", "arguments": {"url": "{{input.url}}", "payload": {"n": n}}}


def test_killed_while_the_model_answers_the_turn_is_asked_again_under_its_key_and_acts_once(
        model, webhook, worker, start_worker):
    a = define("crashy", tools=[POST])
    turns = [{"tool_calls": [post(1)]}, {"content": "done"}]
    model.script({a: [{**turns[0], "delay_seconds": 30}, turns[1]]})
    workers = [worker, start_worker("runner-b")]
    run = run_start(agent=a, input={"url": webhook.url + "/hook"}).run
    wait_for(lambda: model.state()["by_turn"].get(f"{a}:0") == 1, timeout=30,
             what="the first turn to reach the model")
    victim = holder(run.id, workers)
    victim.kill()  # the answer is still 30 s away
    model.script({a: turns})
    done = wait_for(lambda: (r := Run.objects.get(id=run.id)).is_finished and r, timeout=90,
                    what="the run to resume on the other worker and finish")
    assert done.status == "succeeded", done.error
    assert victim.process.poll() is not None and done.lease_epoch >= 2
    state = model.state()
    # The lost answer was never recorded, so the ledger asked again, under the same key (a
    # provider that honoured keys would answer it once); the recorded turn was not asked again.
    assert state["by_turn"] == {f"{a}:0": 2, f"{a}:1": 1}
    assert sorted(state["by_key"].values()) == [1, 2]
    assert webhook.state()["deliveries"] == 1
    recorded = Effect.objects.filter(run=done, name="turn")
    assert done.tokens_used == sum(e.result["usage"]["total_tokens"] for e in recorded)


def test_killed_after_the_reply_is_recorded_the_tools_run_once_and_the_model_is_not_asked_again(
        model, webhook, smtp_server, worker, start_worker):  # noqa: F811
    credential_set(connector="email", secrets={"host": "127.0.0.1", "port": smtp_server.port})
    a = define("crashy", tools=[{"name": "mail", "kind": "connector", "action": "email.send"}, POST])
    mail = {"name": "mail", "arguments": {"to": "a@example.com", "subject": "hi", "body": "b"}}
    model.script({a: [{"tool_calls": [mail, post(1)]}, {"content": "done"}]})
    workers = [worker, start_worker("runner-b")]
    smtp_server.inbox.hold_seconds = 30  # accepted; the 250 comes 30 s later
    run = run_start(agent=a, input={"url": webhook.url + "/hook"}).run
    wait_for(lambda: len(smtp_server.messages) == 1, timeout=30, what="the mail to arrive")
    assert webhook.state()["deliveries"] == 0  # the second call waits for the first
    victim = holder(run.id, workers)
    victim.kill()
    smtp_server.inbox.hold_seconds = 0
    # SMTP cannot say whether the mail went out: the run parks for a person (in the main step:
    # a fan-out branch would have failed, and the model could have sent it again)
    approval = wait_for(lambda: Approval.objects.filter(run=run, status="pending").first(),
                        timeout=60, what="'did it go out?' in the inbox")
    assert approval.kind == "effect_outcome" and approval.request["effect"] == "tool:call_0_0"
    approval_decide(approval_id=approval.id, approve=True, by="user:ann@acme.test")
    done = wait_for(lambda: (r := Run.objects.get(id=run.id)).is_finished and r, timeout=60,
                    what="the run to finish")
    assert done.status == "succeeded", done.error
    assert victim.process.poll() is not None and done.lease_epoch >= 2
    assert model.state()["by_turn"] == {f"{a}:0": 1, f"{a}:1": 1}
    assert len(smtp_server.messages) == 1 and webhook.state()["deliveries"] == 1
