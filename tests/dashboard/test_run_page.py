"""The Run page: the header's five answers, the timeline, the session log and its filters,
effects, checkpoints and their diff, and the actions by role (cancel, re-queue, migrate, fork,
sending the event a run waits for), with the test client against the real database; runs are
driven in this process (tests.support.runs) or by the real worker."""

import uuid

import pytest
from django.urls import NoReverseMatch, reverse
from django.utils.html import escape
from django_tenants.utils import tenant_context

from dashboard import timeline
from dashboard.diffs import Change, json_diff
from dashboard.situation import trim
from dashboard.views import run as run_views
from integrations.services import credential_set
from runs.agents import Agent, RetryPolicy
from runs.approvals.models import Approval
from runs.effects.models import Effect
from runs.models import Run, RunEvent
from runs.services import run_start
from runs.transitions import finish, goto
from tenants.models import AuditEntry
from tests.support.fakes.fixtures import smtp_server  # noqa: F401
from tests.support.runs import finished, start
from tests.support.waiting import wait_for

from .conftest import person, signed_in

# -- agents of these tests, run in this process only ----------------------------------------
LONG_ERROR = "the ledger refused the booking: " + " ".join(f"reason-{n}" for n in range(120))

failer = Agent("dash_failer", version=1, retry=RetryPolicy(max_attempts=2, initial_backoff=0.0))


@failer.step(start=True, next=["book"])
def prepare(ctx, state):
    return goto("book", update={"prepared": True})


@failer.step(next=[])
def book(ctx, state):
    raise RuntimeError(LONG_ERROR)


failer_v2 = Agent("dash_failer", version=2)


@failer_v2.step(start=True, next=["book"], name="prepare")
def prepare_v2(ctx, state):
    return goto("book")


@failer_v2.step(next=[], name="book")
def book_v2(ctx, state):
    return finish("booked")


def page(client, run_id, query=""):
    return client.get(f"/t/acme/runs/{run_id}{query}")


def text(response) -> str:
    return response.content.decode()


# -- pure parts: the diff and the trim ---------------------------------------------------------

def test_json_diff_names_added_removed_and_changed_paths():
    before = {"a": 1, "b": {"c": [1, 2, 3], "d": "x"}, "gone": True, "odd key": 1}
    after = {"a": 1, "b": {"c": [1, 5], "d": "y", "e": None}, "new": [1], "odd key": 2}
    assert json_diff(before, after) == [
        Change("b.c[1]", "changed", 2, 5), Change("b.c[2]", "removed", before=3),
        Change("b.d", "changed", "x", "y"), Change("b.e", "added", after=None),
        Change("gone", "removed", before=True), Change("new", "added", after=[1]),
        Change('["odd key"]', "changed", 1, 2)]
    assert json_diff({"n": 1}, {"n": True}) == [Change("n", "changed", 1, True)]
    assert json_diff({"x": [1]}, {"x": [1]}) == []
    assert json_diff([1], {"a": 1}) == [Change("(whole document)", "changed", [1], {"a": 1})]


def test_trim_keeps_short_texts_and_cuts_long_ones_at_a_word():
    assert trim("  short  ") == "short"
    cut = trim(LONG_ERROR)
    assert len(cut) <= 302 and cut.endswith(" …") and LONG_ERROR.startswith(cut[:-2])


# -- the header: waiting, next step, failure ---------------------------------------------------

def test_a_failed_step_shows_its_error_trimmed_with_the_full_text_behind_details(acme, as_role):
    with tenant_context(acme):
        run = finished(start("dash_failer", version=1).id)
    assert run.status == "failed"
    response = page(as_role("viewer"), run.id)
    body = text(response)
    assert response.status_code == 200
    header = body.split('id="run-header"')[1].split("</section>")[0]
    assert "Step <code>book</code> (visit 1)" in header
    assert escape(trim(run.error)) in header  # the short text where the question is answered
    assert "reason-119" not in header.split("<details>")[0]  # the rest only behind <details>
    assert "<summary>The full error and traceback</summary>" in header and "reason-119" in header
    assert "No: it failed." in header
    assert "failed at book" in body  # the steps picture's accessible name says it in words
    # the session log filters: failures only shows the step's errors, not its creation
    failures = text(page(as_role("viewer"), run.id, "?log=failures"))
    log = failures.split('id="session-log"')[1]
    assert "<code>step_error</code>" in log and "<code>run_created</code>" not in log
    one_step = text(page(as_role("viewer"), run.id, "?log=step&step=prepare"))
    log = one_step.split('id="session-log"')[1]
    assert "<code>run_created</code>" in log and "<code>step_error</code>" not in log


def test_a_step_that_chose_to_fail_is_named_with_its_reason(acme, as_role):
    with tenant_context(acme):
        run = finished(start("rulebreaker", input={"how": "fails"}).id)
    header = text(page(as_role("viewer"), run.id)).split('id="run-header"')[1].split("</section>")[0]
    assert 'Step <code>start</code> (visit 0): <span class="error-text">the agent gave up</span>' in header
    assert "The full error" not in header  # nothing was trimmed, and there is no traceback


def test_a_run_waiting_on_an_event_says_what_for_and_what_runs_next(acme, as_role):
    key = f"k-{uuid.uuid4().hex[:8]}"
    with tenant_context(acme):
        run = finished(start("waiter", input={"how": "event", "kind": "doc.signed", "key": key,
                                              "timeout": 3600}).id)
    assert run.status == "waiting"
    body = text(page(as_role("viewer"), run.id))
    header = body.split('id="run-header"')[1].split("</section>")[0]
    assert f"It waits for the event <code>doc.signed</code> with key <code>{key}</code>" in header
    assert "then it goes to <code>gave_up</code>" in header
    assert "Step <code>event_seen</code>, when the event arrives" in header
    assert 'hx-trigger="every 2s' in header  # live while unfinished
    assert "Send the event it waits for" not in body  # a viewer has no actions
    picture = body.split('aria-label="Steps picture">')[1].split("</svg>")[0]
    assert "now at event_seen" in picture and "waiting" in picture


def test_a_sleeping_run_says_until_when(acme, as_role):
    with tenant_context(acme):
        run = finished(start("waiter", input={"how": "sleep", "seconds": 3600}).id)
    body = text(page(as_role("viewer"), run.id))
    assert "It sleeps until <time" in body and "(a timer)" in body
    assert "Step <code>slept</code>, when the timer is due" in body
    as_role("operator").post(f"/t/acme/runs/{run.id}/cancel", {"confirm": "yes"})
    with tenant_context(acme):
        assert Run.objects.get(id=run.id).status == "cancelled"


def test_the_header_alone_refreshes_and_says_when_the_status_changed(acme, as_role):
    with tenant_context(acme):
        run = finished(start("waiter", input={"how": "approval"}).id)
    client = as_role("viewer")
    partial = client.get(f"/t/acme/runs/{run.id}/header?seen=waiting")
    assert partial.status_code == 200
    assert text(partial).startswith('<section id="run-header"') and "<html" not in text(partial)
    assert "It waits for a decision: <strong>Ship it?</strong>" in text(partial)
    assert "You may not decide it." in text(partial)  # a viewer
    decider = as_role("approver").get(f"/t/acme/runs/{run.id}/header")
    assert "You may decide it." in text(decider)
    assert "Step <code>decided</code>, when the approval is decided" in text(partial)
    assert "The run is now" not in text(partial)
    changed = text(client.get(f"/t/acme/runs/{run.id}/header?seen=running"))
    assert "The run is now <strong>waiting</strong> (it was running" in changed


# -- sending the event a run waits for, from the page, with the real worker --------------------

@pytest.fixture
def mail(acme, smtp_server):  # noqa: F811
    with tenant_context(acme):
        credential_set(connector="email", secrets={"host": "127.0.0.1", "port": smtp_server.port})
    return smtp_server


def status_is(acme, run_id, *statuses):
    with tenant_context(acme):
        return Run.objects.get(id=run_id).status in statuses


def test_the_onboarding_demo_moves_on_when_its_event_is_sent_from_the_page(acme, worker, mail):
    email = f"ada-{uuid.uuid4().hex[:6]}@acme.test"
    operator = person(acme, "operator")
    client = signed_in(operator)
    with tenant_context(acme):
        run = run_start(agent="onboarding", input={
            "employee": {"name": "Ada", "email": email}, "it_email": "it@acme.test",
            "start_date": "2030-01-07"}).run
    wait_for(lambda: status_is(acme, run.id, "waiting"), timeout=30, what="the docs wait")
    body = text(page(client, run.id))
    assert f"It waits for the event <code>docs.signed</code> with key <code>{email}</code>" in body
    assert "Step <code>provision</code>, when the event arrives" in body
    assert "<strong>welcome_packet</strong> <span class=\"muted\">(email, visit 0)</span>: Happened." in body
    assert f'id="event-key" name="key" value="{email}" readonly' in body
    effects = body.split('<table class="effects">')[1].split("</table>")[0]
    assert "<strong>welcome_packet</strong>" in effects and "status-done\">done" in effects
    assert "Migrate</h3>" not in body  # no newer onboarding is registered

    # bad input: an error, and what was typed is kept
    bad = client.post(f"/t/acme/runs/{run.id}/event", {"payload": '{"signed": tru'})
    assert bad.status_code == 400 and "Not valid JSON" in text(bad)
    assert "{&quot;signed&quot;: tru" in text(bad)
    assert client.post(f"/t/acme/runs/{run.id}/event", {"payload": "[1]"}).status_code == 400

    sent = client.post(f"/t/acme/runs/{run.id}/event", {
        "payload": '{"signed": ["contract", "policy"]}', "kind": "forged", "key": "forged"})
    assert sent.status_code == 302
    assert "the run goes on" in text(client.get(sent["Location"]))
    with tenant_context(acme):
        def asks():
            return Approval.objects.filter(run_id=run.id, status="pending").first()
        approval = wait_for(asks, timeout=30, what="the schedule approval")
        assert approval.then == "await_hardware"
        assert RunEvent.objects.filter(run=run, kind="event_received",
                                       data__event_kind="docs.signed").exists()
    entry = AuditEntry.objects.filter(tenant=acme, action="event.sent",
                                      target=f"run:{run.id}").get()
    assert entry.actor == f"user:{operator.username}" and entry.detail["key"] == email
    body = text(page(client, run.id))
    assert "It waits for a decision: <strong>Day-one schedule for Ada</strong>" in body
    assert "Step <code>await_hardware</code>, when the approval is decided" in body
    assert "child it_provisioning" in body  # the child run has a lane of its own
    assert "Send the event it waits for" not in body  # it waits for a person now
    # the page's event form answers with a message once the run waits for nothing like it
    late = client.post(f"/t/acme/runs/{run.id}/event", {"payload": "{}"}, follow=True)
    assert "not waiting for an event" in text(late)
    client.post(f"/t/acme/runs/{run.id}/cancel", {"confirm": "yes"})


# -- effects: an outcome nobody knows is said in words ---------------------------------------

def test_an_effect_of_unknown_outcome_is_said_in_words(acme, as_role):
    with tenant_context(acme):
        run = start("chatter", input={"steps": 1})
        Effect.objects.create(run=run, scope="0", name="charge", connector="payments",
                              args_hash="x", idempotency_key=uuid.uuid4().hex, status="unknown",
                              attempts=1, maybe_sent=True)
        Effect.objects.create(run=run, scope="0", name="receipt", connector="email",
                              args_hash="y", idempotency_key=uuid.uuid4().hex, status="failed",
                              attempts=3, error="mailbox full")
        ask = Approval.objects.create(run=run, visit=0, kind="effect_outcome",
                                      request={"title": "Did the charge go through?",
                                               "scope": "0", "effect": "charge"}, then="talk")
    body = text(page(as_role("viewer"), run.id))
    assert "Outcome unknown: the call may or may not have reached payments" in body
    try:  # the inbox's page (another area's URL), once it is mounted
        inbox = reverse("dashboard:approval", args=["acme", ask.id])
    except NoReverseMatch:
        inbox = None
    if inbox:
        assert f'<a href="{inbox}">Say whether it arrived</a>' in body
    assert "<strong>receipt</strong>" in body and "Failed: mailbox full" in body
    assert '<span class="status status-unknown">unknown</span>' in body


# -- checkpoints: the state at each, and a diff between two -----------------------------------

def test_checkpoint_state_and_the_diff_of_a_known_pair(acme, as_role):
    with tenant_context(acme):
        run = finished(start("chatter", input={"steps": 3}).id)
    client = as_role("viewer")
    state = client.get(f"/t/acme/runs/{run.id}/checkpoints/2", HTTP_HX_REQUEST="true")
    assert state.status_code == 200 and "<html" not in text(state)
    assert '&quot;said&quot;: 2' in text(state) and "message 000002" in text(state)
    assert client.get(f"/t/acme/runs/{run.id}/checkpoints/2").status_code == 200  # a page
    assert client.get(f"/t/acme/runs/{run.id}/checkpoints/99").status_code == 404

    diff = text(page(client, run.id, "?a=1&b=2")).split('<table class="diff">')[1]
    rows = diff.split("</table>")[0]
    assert "Changes from visit 1 to visit 2: 2" in rows
    assert '<td class="mono">state.said</td><td>changed</td>' in rows
    assert "<code>1</code>" in rows and "<code>2</code>" in rows
    assert '<td class="mono">logs.messages[1]</td><td>added</td>' in rows
    first = text(page(client, run.id, "?a=0&b=1"))
    assert '<td class="mono">logs.messages</td><td>added</td>' in first
    assert '<td class="mono">state.said</td><td>added</td>' in first
    assert "The run has no checkpoint at one of those visits" in text(page(client, run.id, "?a=0&b=77"))
    assert "Choose two checkpoints" in text(page(client, run.id, "?a=x&b=1"))
    # the timeline has one bar per step visit, and a table of the same spans
    body = text(page(client, run.id))
    assert body.count('class="span span-step"') == 4  # talk ×3, done
    assert "The timeline as a table" in body
    assert "×3" in body  # talk's visits, in the steps picture
    assert "path taken: talk → talk → talk → done" in body
    assert "Path taken: <code>talk</code> → <code>talk</code> → <code>talk</code> → <code>done</code>" in body


# -- actions by role -------------------------------------------------------------------------

ACTIONS = ["cancel", "requeue", "migrate", "fork", "event"]


def test_a_viewer_sees_no_actions_and_every_action_post_is_403(acme):
    with tenant_context(acme):
        run = finished(start("waiter", input={"how": "approval"}).id)
    viewer = signed_in(person(acme, "viewer"))
    body = text(page(viewer, run.id))
    assert "Actions</h2>" not in body and "/cancel" not in body
    for action in ACTIONS:
        assert viewer.post(f"/t/acme/runs/{run.id}/{action}", {"confirm": "yes", "version": 2,
                                                              "visit": 0}).status_code == 403
    with tenant_context(acme):
        assert Run.objects.get(id=run.id).status == "waiting"


def test_an_approver_cannot_cancel_and_an_operator_cannot_fork(acme):
    with tenant_context(acme):
        waiting = finished(start("waiter", input={"how": "approval"}).id)
        done = finished(start("chatter", input={"steps": 1}).id)
    approver = signed_in(person(acme, "approver"))
    assert approver.post(f"/t/acme/runs/{waiting.id}/cancel", {"confirm": "yes"}).status_code == 403
    operator = signed_in(person(acme, "operator"))
    assert "/fork" not in text(page(operator, done.id))
    assert operator.post(f"/t/acme/runs/{done.id}/fork", {"visit": 0}).status_code == 403
    with tenant_context(acme):
        assert Run.objects.get(id=waiting.id).status == "waiting"
        assert not Run.objects.filter(forked_from=done).exists()


def test_an_operator_cancels_with_a_confirmation_and_is_recorded(acme):
    with tenant_context(acme):
        run = finished(start("waiter", input={"how": "approval"}).id)
    operator = person(acme, "operator")
    client = signed_in(operator)
    assert "Cancel the run" in text(page(client, run.id))
    unconfirmed = client.post(f"/t/acme/runs/{run.id}/cancel", {}, follow=True)
    assert "Tick the box to confirm" in text(unconfirmed)
    with tenant_context(acme):
        assert Run.objects.get(id=run.id).status == "waiting"
    response = client.post(f"/t/acme/runs/{run.id}/cancel", {"confirm": "yes"})
    assert response.status_code == 302
    with tenant_context(acme):
        assert Run.objects.get(id=run.id).status == "cancelled"
        event = RunEvent.objects.get(run=run, kind="run_cancelled")
    assert event.data["by"] == f"user:{operator.username}"
    again = client.post(f"/t/acme/runs/{run.id}/cancel", {"confirm": "yes"}, follow=True)
    assert again.status_code == 200 and "run is already cancelled (run_finished)" in text(again)
    body = text(page(client, run.id))
    assert 'hx-trigger="every 2s' not in body and "Cancel the run" not in body
    assert f"by user:{operator.username}" in body  # in the session log


def test_requeue_refused_by_the_service_is_a_message(acme, as_role):
    with tenant_context(acme):
        run = finished(start("waiter", input={"how": "approval"}).id)
    operator = as_role("operator")
    assert "Re-queue</button>" not in text(page(operator, run.id))  # not offered while it waits
    response = operator.post(f"/t/acme/runs/{run.id}/requeue", follow=True)
    assert response.status_code == 200 and "run_waiting_on_something" in text(response)


def test_an_owner_forks_from_a_checkpoint(acme):
    with tenant_context(acme):
        run = finished(start("chatter", input={"steps": 2}).id)
    owner = person(acme, "owner")
    client = signed_in(owner)
    body = text(page(client, run.id))
    assert '<option value="1">1: before talk</option>' in body
    response = client.post(f"/t/acme/runs/{run.id}/fork", {"visit": "1"})
    assert response.status_code == 302
    with tenant_context(acme):
        fork = Run.objects.get(forked_from=run)
        event = RunEvent.objects.get(run=fork, kind="run_forked")
    assert response["Location"] == f"/t/acme/runs/{fork.id}"
    assert fork.forked_from_visit == 1 and event.data["by"] == f"user:{owner.username}"
    ended = client.post(f"/t/acme/runs/{run.id}/fork", {"visit": "3"}, follow=True)
    assert "checkpoint_ended" in text(ended)


def test_an_operator_migrates_a_failed_run_to_a_newer_version(acme):
    with tenant_context(acme):
        run = finished(start("dash_failer", version=1).id)
    operator = person(acme, "operator")
    client = signed_in(operator)
    body = text(page(client, run.id))
    assert '<option value="2">v2</option>' in body
    response = client.post(f"/t/acme/runs/{run.id}/migrate", {"version": "2"})
    assert response.status_code == 302
    with tenant_context(acme):
        migrated = Run.objects.get(id=run.id)
        event = RunEvent.objects.get(run=run, kind="run_migrated")
    # in line again (a session worker may have taken it already, and hands it back: unknown)
    assert migrated.agent_version == 2 and migrated.status in ("queued", "running")
    assert event.data["by"] == f"user:{operator.username}" and event.data["to_version"] == 2
    refused = client.post(f"/t/acme/runs/{run.id}/migrate", {"version": "2"}, follow=True)
    assert "run_not_migratable" in text(refused)  # queued now: only waiting or failed runs
    # no worker knows this test's agent: take it out of line
    client.post(f"/t/acme/runs/{run.id}/cancel", {"confirm": "yes"})


# -- another tenant's run ---------------------------------------------------------------------

def test_a_globex_run_under_acme_is_404(acme, globex):
    with tenant_context(globex):
        theirs = finished(start("waiter", input={"how": "approval"}).id)
    owner = signed_in(person(acme, "owner"))
    for suffix in ("", "/header", "/checkpoints/0"):
        assert owner.get(f"/t/acme/runs/{theirs.id}{suffix}").status_code == 404
    for action in ACTIONS:
        assert owner.post(f"/t/acme/runs/{theirs.id}/{action}", {"confirm": "yes"}).status_code == 404
    with tenant_context(globex):
        assert Run.objects.get(id=theirs.id).status == "waiting"


def test_a_fan_out_has_a_lane_per_branch_and_its_wait_is_a_parked_span(acme, as_role, worker):
    with tenant_context(acme):
        run = run_start(agent="fanner", input={"count": 3}).run
    wait_for(lambda: status_is(acme, run.id, "succeeded"), timeout=30, what="the fan-out")
    body = text(page(as_role("viewer"), run.id))
    svg = body.split('<svg class="timeline-svg"')[1].split("</svg>")[0]
    for index in range(3):
        assert f">branch 1/{index}</text>" in svg
    assert svg.count('class="span span-branch"') == 3
    assert svg.count('class="span span-parked"') == 1  # spread → (parked) → total
    assert svg.count('class="span span-step"') == 2
    assert "done · ×3" in body  # square, visited by the three branches, in the steps picture


def test_a_long_run_shows_its_latest_spans_and_checkpoints(acme, as_role, monkeypatch):
    monkeypatch.setattr(timeline, "MAX_RUN_SPANS", 2)
    monkeypatch.setattr(run_views, "CHECKPOINTS_SHOWN", 2)
    with tenant_context(acme):
        run = finished(start("chatter", input={"steps": 3}).id)  # checkpoints 0-4
    client = as_role("viewer")
    body = text(page(client, run.id))
    assert body.count('class="span span-step"') == 2
    assert "The run's first 2 spans are not drawn" in body
    assert "The latest 2 are listed; 3 earlier ones" in body
    assert "Changes from visit 0 to visit 1" in text(page(client, run.id, "?a=0&b=1"))
