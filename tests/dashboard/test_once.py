"""Lost or doubled work from the dashboard's actions: a form sent twice (a double click, two
tabs, a retry after a lost response) does its work once, and a refusal is never a loop."""

import re
import threading
import uuid

import pytest
from django.db import DatabaseError, connection
from django.test import Client
from django_tenants.utils import tenant_context

from dashboard.views import run as run_views
from runs import engine, services
from runs.agents import Agent
from runs.approvals.models import Approval, InboundEvent
from runs.engine.ports import ports
from runs.models import Branch, Run
from runs.services import RunError, run_requeue
from runs.transitions import fail, fan_out, finish, run_child, wait_for_event
from tenants import people
from tenants.models import AuditEntry
from tenants.people import invitation_create, invitations_open
from tests.support.fakes.fixtures import smtp_server  # noqa: F401  (a fixture)
from tests.support.fakes.smtp import free_port
from tests.support.mail import link_in, smtp_to
from tests.support.runs import finished, start
from tests.support.waiting import wait_for

from .conftest import person, signed_in

# -- an agent that waits twice for the same event (a loop on one correlation key) -------------
twice = Agent("dash_twice", version=1)


@twice.step(start=True, next=["second"])
def first(ctx, state):
    return wait_for_event("dash.twice", state["key"], then="second")


@twice.step(next=["done"])
def second(ctx, state):
    return wait_for_event("dash.twice", state["key"], then="done",
                          update={"first": state["event"]["payload"]})


@twice.step(next=[])
def done(ctx, state):
    return finish(state["event"]["payload"])


def _event_form(client, run_id) -> dict:
    """What the page's send-event form posts: its inputs as the page renders them."""
    body = client.get(f"/t/acme/runs/{run_id}").content.decode()
    form = body.split('class="send-event">')[1].split("</form>")[0]
    return {name: value for name, value in
            re.findall(r'<input[^>]*name="([^"]+)"[^>]*value="([^"]*)"', form)}


def _cancel_if_running(acme, run_id) -> None:
    """Leave no run for a worker (another test's may be about): cancel it unless it ended."""
    with tenant_context(acme):
        try:
            services.run_cancel(run_id=run_id)
        except RunError as exc:
            assert exc.code == "run_finished"


def _parked_twice(acme):
    key = f"k-{uuid.uuid4().hex[:8]}"
    with tenant_context(acme):
        run = finished(start("dash_twice", input={"key": key}).id)
        assert run.status == Run.Status.WAITING
    return run, key


def _events(acme, key) -> int:
    with tenant_context(acme):
        return InboundEvent.objects.filter(kind="dash.twice", key=key).count()


def test_the_event_form_sent_again_after_a_lost_response_is_not_delivered_twice(acme):
    """The person sends the event; the run wakes and parks again on the same key; the answer
    never reached the browser, so the same form is sent again. The second wait must not take
    the retry of the first send."""
    client = signed_in(person(acme, "operator"))
    run, key = _parked_twice(acme)
    form = _event_form(client, run.id)
    form["payload"] = '{"n": 1}'
    assert client.post(f"/t/acme/runs/{run.id}/event", form).status_code == 302
    with tenant_context(acme):
        run = finished(run.id)  # woken: it waits again, for the same event
        assert run.status == Run.Status.WAITING and run.checkpoints.count() == 4

    retry = client.post(f"/t/acme/runs/{run.id}/event", form, follow=True)
    assert "already sent" in retry.content.decode()
    assert _events(acme, key) == 1
    with tenant_context(acme):
        assert Run.objects.get(id=run.id).status == Run.Status.WAITING  # still waits


def test_the_event_form_sent_from_two_tabs_at_once_is_delivered_once(acme, monkeypatch):
    """A double click (or two tabs of one page): both requests find the run waiting before
    either delivers. One event is recorded; the other request is told it was already sent."""
    operator = person(acme, "operator")
    clients = [signed_in(operator), signed_in(operator)]
    run, key = _parked_twice(acme)
    form = _event_form(clients[0], run.id)
    form["payload"] = '{"n": 1}'
    both_checked = threading.Barrier(2, timeout=10)
    submit = run_views.event_submit

    def submit_after_both_checked(**kwargs):
        both_checked.wait()
        return submit(**kwargs)

    monkeypatch.setattr(run_views, "event_submit", submit_after_both_checked)
    answers = [None, None]

    def send(i):
        try:
            answers[i] = clients[i].post(f"/t/acme/runs/{run.id}/event", form, follow=True)
        finally:
            connection.close()

    threads = [threading.Thread(target=send, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    said = [a.content.decode() for a in answers]
    assert sum("the run goes on" in s for s in said) == 1, said
    assert sum("already sent" in s for s in said) == 1
    assert _events(acme, key) == 1
    with tenant_context(acme):
        run = finished(run.id)  # the second wait is not taken by the second click
        assert run.status == Run.Status.WAITING


# -- re-queue must not run a fan-out's join before its branches -------------------------------

# the workers of other tests do not register this test module's agents: only this process
# runs them, so a worker about cannot run the branches first
fan_local = Agent("dash_fan", version=1)


@fan_local.step(start=True, next=["squared", "summed"])
def fan_spread(ctx, state):
    return fan_out("squared", list(range(state["count"])), then="summed")


@fan_local.step(next=[], name="squared")
def fan_square(ctx, state):
    return finish(ctx.item * ctx.item)


@fan_local.step(next=[], name="summed")
def fan_total(ctx, state):
    results = ctx.fan_out
    failed = [r.error for r in results if not r.ok]
    if failed:
        return fail(f"{len(failed)} branches failed: {failed[0]}")
    return finish({"branches": len(results), "total": sum(r.value for r in results)})


def test_re_queueing_a_run_at_a_fan_out_join_keeps_its_branches(acme):
    """Re-queue (the run page's and the bulk action) of a run waiting for its fan-out branches
    ran the join at once: the branches, never run, counted as failed and so did the run."""
    client = signed_in(person(acme, "operator"))
    with tenant_context(acme):
        run = finished(start("dash_fan", input={"count": 3}).id)
        assert run.status == Run.Status.WAITING and run.waiting_reason.startswith("fan_out")
    answer = client.post(f"/t/acme/runs/{run.id}/requeue", follow=True)
    assert "Put back in line" in answer.content.decode()
    bulk = client.post("/t/acme/runs/bulk", {"action": "requeue", "run": [str(run.id)],
                                             "confirm": "1"}, follow=True)
    assert "1 run re-queued." in bulk.content.decode()
    with tenant_context(acme):
        assert Run.objects.get(id=run.id).status == Run.Status.WAITING  # for its branches
        def branches_done():  # a worker about may hold a branch a moment (it lacks the agent)
            for index in range(3):
                engine.branch_advance(run_id=run.id, index=index)
            return not Branch.objects.filter(run_id=run.id).exclude(
                status=Branch.Status.DONE).exists()
        wait_for(branches_done, timeout=30, what="the branches")

        def joined():  # a worker about may hold the run a moment (it lacks the agent)
            finished(run.id)
            return Run.objects.filter(id=run.id).exclude(
                status__in=[Run.Status.QUEUED, Run.Status.RUNNING]).first()
        run = wait_for(joined, timeout=30, what="the join")
        assert run.status == Run.Status.SUCCEEDED, run.error
        assert run.result == {"branches": 3, "total": 0 + 1 + 4}


# -- re-queue racing a run that parks for a person -------------------------------------------

def test_re_queue_while_the_run_parks_on_an_approval_leaves_it_waiting(acme, monkeypatch):
    """A run page shows re-queue for a running run. The person asks just as the run parks on an
    approval: run_requeue looked for a pending approval before it locked the run, saw none (the
    parking was not committed yet), then queued the parked run, which would resume at the step
    after the approval without any decision."""
    with tenant_context(acme):
        run = start("waiter", input={"how": "approval"})
    parking = ports().parking
    opened, release = threading.Event(), threading.Event()
    approval_open = parking["approval"]

    def approval_open_then_hold(**kwargs):
        approval = approval_open(**kwargs)
        opened.set()  # the parking transaction holds the run's row, not committed yet
        assert release.wait(timeout=30)
        return approval

    monkeypatch.setitem(parking, "approval", approval_open_then_hold)
    outcomes = {}

    def in_acme(name, action):
        def act():
            try:
                with tenant_context(acme):
                    outcomes[name] = action()
            except RunError as exc:
                outcomes[name] = exc.code
            finally:
                connection.close()
        return threading.Thread(target=act)

    parker = in_acme("park", lambda: engine.advance(run_id=run.id))
    parker.start()
    assert opened.wait(timeout=30)
    requeuer = in_acme("requeue", lambda: run_requeue(run_id=run.id, by="user:x"))
    requeuer.start()
    with connection.cursor() as cursor:  # the re-queue waits for the parking's row lock
        def blocked():
            cursor.execute("SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = "
                           "l.database WHERE d.datname = current_database() AND NOT l.granted")
            return cursor.fetchone()[0] > 0
        wait_for(blocked, timeout=30, what="the re-queue to wait for the run's row")
    release.set()
    parker.join(timeout=30)
    requeuer.join(timeout=30)
    assert outcomes["park"] == engine.Outcome.PARKED
    assert outcomes["requeue"] == "run_waiting_on_something"
    with tenant_context(acme):
        assert Run.objects.get(id=run.id).status == Run.Status.WAITING
        assert Approval.objects.filter(run_id=run.id, status=Approval.Status.PENDING).exists()


# -- inviting again while the mail server is down --------------------------------------------

def test_an_invitation_sent_again_while_mail_is_down_keeps_the_one_already_emailed(
        acme, smtp_server):  # noqa: F811
    """Inviting an address again revokes its open invitation; when the new email cannot be
    sent, the new invitation is revoked too, so the link the person already holds died with
    a resend (or a second click) that invited nobody."""
    owner = person(acme, "owner")
    client = signed_in(owner)
    email = f"again-{uuid.uuid4().hex[:8]}@invited.test"
    with smtp_to(smtp_server):
        assert client.post("/t/acme/members/invite",
                           {"email": email, "role": "viewer"}).status_code == 302
    [message] = smtp_server.inbox.by_header("To", email)
    link = link_in(message)

    class Nowhere:
        host, port = "127.0.0.1", free_port()  # nothing listens there

    with smtp_to(Nowhere):
        again = client.post("/t/acme/members/invite", {"email": email, "role": "operator"})
    assert again.status_code == 400 and b"could not be sent" in again.content
    [still_open] = [i for i in invitations_open(tenant=acme) if i.email == email]
    assert still_open.role == "viewer"  # the one emailed, as it was
    assert b"viewer" in Client().get(link).content  # its link still works


def test_an_event_sent_whose_audit_entry_fails_is_sent_again_by_the_retry(acme, monkeypatch):
    """The event and its audit entry commit together: when recording who sent it fails (the
    person sees an error page), nothing was delivered, and sending the form again delivers it
    once and records who did."""
    operator = person(acme, "operator")
    client = signed_in(operator)
    run, key = _parked_twice(acme)
    form = _event_form(client, run.id)
    form["payload"] = '{"n": 1}'
    record = run_views.audit_record

    def audit_down(**kwargs):
        raise DatabaseError("the audit log is away")

    monkeypatch.setattr(run_views, "audit_record", audit_down)
    with pytest.raises(DatabaseError):
        client.post(f"/t/acme/runs/{run.id}/event", form)
    monkeypatch.setattr(run_views, "audit_record", record)
    assert _events(acme, key) == 0
    retry = client.post(f"/t/acme/runs/{run.id}/event", form, follow=True)
    assert "the run goes on" in retry.content.decode()
    assert _events(acme, key) == 1
    assert AuditEntry.objects.filter(tenant=acme, action="event.sent", target=f"run:{run.id}",
                                     actor=f"user:{operator.username}").count() == 1


def test_an_invitation_revoked_whose_audit_entry_fails_stays_open(acme, monkeypatch):
    """A revocation and its audit entry commit together, as every other change to members."""
    owner = person(acme, "owner")
    invited = invitation_create(tenant=acme, email=f"r-{uuid.uuid4().hex[:8]}@invited.test",
                                role="viewer", by="test")

    def audit_down(**kwargs):
        raise DatabaseError("the audit log is away")

    monkeypatch.setattr(people, "audit_record", audit_down)
    with pytest.raises(DatabaseError):
        people.invitation_revoke(tenant=acme, invitation_id=invited.invitation.id,
                                 by=f"user:{owner.username}")
    assert invited.invitation.id in {i.id for i in invitations_open(tenant=acme)}


# -- the start form sent again with another durability ---------------------------------------

def test_the_start_form_sent_again_with_another_durability_starts_no_run_silently(acme):
    """Back, change only the durability, send: the key's first run (sync) was answered as if
    it were this request, so the person believed an exit-durability run had started."""
    client = signed_in(person(acme, "operator"))
    page = client.get("/t/acme/runs/start", {"agent": "research"}).content.decode()
    key = re.search(r'name="idempotency_key" value="([0-9a-f-]+)"', page)[1]
    form = {"agent": "research", "version": "", "input": '{"topic": "once"}',
            "durability": "sync", "idempotency_key": key}
    assert client.post("/t/acme/runs/start", form).status_code == 302
    changed = client.post("/t/acme/runs/start", {**form, "durability": "exit"})
    assert changed.status_code == 200
    assert "already used to start a run with other values" in changed.content.decode()
    with tenant_context(acme):
        [started] = Run.objects.filter(idempotency_key=key)
    assert started.durability == "sync"
    _cancel_if_running(acme, started.id)


# -- the fork form sent twice ----------------------------------------------------------------

def test_the_fork_form_sent_twice_makes_one_fork(acme):
    """A fork is a new run whose effects are new (new keys): a double click on Fork, or a retry
    after a lost answer, made two forks, and each would perform the effects again."""
    with tenant_context(acme):
        run = finished(start("chatter", input={"steps": 2}).id)
    client = signed_in(person(acme, "owner"))
    body = client.get(f"/t/acme/runs/{run.id}").content.decode()
    fork_form = body.split(f'action="/t/acme/runs/{run.id}/fork"')[1].split("</form>")[0]
    form = dict(re.findall(r'<input[^>]*name="([^"]+)"[^>]*value="([^"]*)"', fork_form))
    form["visit"] = "1"
    first = client.post(f"/t/acme/runs/{run.id}/fork", form)
    again = client.post(f"/t/acme/runs/{run.id}/fork", form, follow=True)
    with tenant_context(acme):
        forks = list(Run.objects.filter(forked_from=run))
    assert len(forks) == 1
    assert first["Location"] == f"/t/acme/runs/{forks[0].id}"
    assert again.redirect_chain[-1][0] == f"/t/acme/runs/{forks[0].id}"
    assert "already forked" in again.content.decode()
    _cancel_if_running(acme, forks[0].id)


# -- a child run refused by its agent's input schema -------------------------------------------

strict_child = Agent("dash_strict_child", version=1, input_schema={
    "type": "object", "required": ["n"], "properties": {"n": {"type": "integer"}}})


@strict_child.step(start=True, next=[])
def strict_only(ctx, state):
    return finish(state["n"])


bad_parent = Agent("dash_bad_parent", version=1)


@bad_parent.step(start=True, next=["after_child"])
def ask_child(ctx, state):
    return run_child("dash_strict_child", {"n": "not a number"}, then="after_child")


@bad_parent.step(next=[])
def after_child(ctx, state):
    return finish(state["event"]["payload"])


def test_a_child_run_refused_by_its_schema_parks_the_parent_saying_to_migrate(acme):
    """The step asks for a child with input its agent refuses. The parent must not loop (it is
    parked, no child is left behind), and the reason must name the refusal and the way out: a
    fixed agent version (migrate); re-queueing runs the same step into the same refusal. It
    said "engine error ... re-queue it"."""
    with tenant_context(acme):
        run = finished(start("dash_bad_parent").id)
        assert run.status == Run.Status.WAITING
        assert not Run.objects.filter(parent_id=run.id).exists()
        assert "engine error" not in run.waiting_reason
        assert "child run of 'dash_strict_child' was refused" in run.waiting_reason
        assert "$.n: 'not a number' is not of type 'integer'" in run.waiting_reason
        assert "migrate" in run.waiting_reason
        services.run_cancel(run_id=run.id)
