"""Attacks on the dashboard's runs half (the Runs list, the Run page, the approvals inbox), each
a regression test: what a hostile tenant member, another tenant, or hostile data fed through a
run tried, and that it now gets a clear answer instead of a 500, markup, or access."""

import json
import threading
import uuid

import pytest
from django.db import connection
from django_tenants.utils import tenant_context

from dashboard.views import run as run_views
from runs.approvals.models import Approval, InboundEvent
from runs.models import Run
from tests.support.runs import finished, start

from .conftest import person, signed_in

# JSON the API's parser refuses (agentplatform.parsers); PostgreSQL cannot store the first four
# (a DataError at the insert) and Python's parser recurses on the last (a RecursionError).
UNSTORABLE = {
    "NaN": ('{"x": NaN}', "Not valid JSON"),
    "Infinity": ('{"x": -Infinity}', "Not valid JSON"),
    "1e400": ('{"x": 1e400}', "must be finite"),
    "NUL": ('{"x": "a\\u0000b"}', "U+0000"),
    "lone surrogate": ('{"x": "\\ud800"}', "surrogate"),
    "deep": ('{"x": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested deeper"),
    "deep enough to store, deeper than the API takes": (
        '{"x": ' + "[" * 40 + "]" * 40 + "}", "nested deeper"),
}


def _said(response, words: str) -> bool:
    return words in response.content.decode()


@pytest.mark.parametrize("case", list(UNSTORABLE))
def test_start_form_refuses_json_the_api_refuses_instead_of_a_500(acme, case):
    text, words = UNSTORABLE[case]
    client = signed_in(person(acme, "operator"))
    key = str(uuid.uuid4())
    response = client.post("/t/acme/runs/start", {
        "agent": "research", "durability": "sync", "input": text, "idempotency_key": key})
    assert response.status_code == 200 and _said(response, words)
    with tenant_context(acme):
        assert not Run.objects.filter(idempotency_key=key).exists()


@pytest.mark.parametrize("case", list(UNSTORABLE))
def test_event_form_refuses_json_the_api_refuses_instead_of_a_500(acme, case):
    text, words = UNSTORABLE[case]
    key = uuid.uuid4().hex
    with tenant_context(acme):
        run = finished(start("waiter", input={"how": "event", "kind": "k.sec", "key": key}).id)
    client = signed_in(person(acme, "operator"))
    response = client.post(f"/t/acme/runs/{run.id}/event", {"payload": text})
    assert response.status_code == 400 and _said(response, words)
    with tenant_context(acme):
        assert not InboundEvent.objects.filter(kind="k.sec", key=key).exists()
        assert Run.objects.get(id=run.id).status == Run.Status.WAITING


@pytest.mark.parametrize("case", list(UNSTORABLE))
def test_edited_artifact_refuses_json_the_api_refuses_instead_of_a_500(acme, case):
    text, words = UNSTORABLE[case]
    with tenant_context(acme):
        run = finished(start("waiter", input={"how": "approval"}).id)
        approval = Approval.objects.get(run=run, status=Approval.Status.PENDING)
    client = signed_in(person(acme, "approver"))
    response = client.post(f"/t/acme/approvals/{approval.id}", {
        "decision": "approve_edited", "artifact": text})
    assert response.status_code == 400 and _said(response, words)
    assert _said(response, "Nothing was decided")
    with tenant_context(acme):
        assert Approval.objects.get(id=approval.id).status == Approval.Status.PENDING


def test_the_header_does_not_echo_a_links_words_as_the_runs_earlier_status(acme):
    """`?seen=` is the status the page was loaded with; a link that sets it to a sentence put
    that sentence in the header ("The run is now queued (it was <sentence> when ...)")."""
    with tenant_context(acme):
        run = start("research", input={"topic": "seen"})
    client = signed_in(person(acme, "viewer"))
    lure = "compromised. Sign in again at evil.example to keep it"
    for url in (f"/t/acme/runs/{run.id}/header", f"/t/acme/runs/{run.id}"):
        body = client.get(url, {"seen": lure}).content.decode()
        assert "evil.example" not in body
        assert "run-changed" not in body  # the run is as it was: nothing to say
    changed = client.get(f"/t/acme/runs/{run.id}/header", {"seen": "running"}).content.decode()
    assert "it was running when this page was loaded" in changed


def test_the_session_logs_step_filter_with_a_nul_is_no_step_not_a_500(acme):
    with tenant_context(acme):
        run = finished(start("waiter", input={"how": "event", "kind": "k.nul", "key": "n"}).id)
    client = signed_in(person(acme, "viewer"))
    response = client.get(f"/t/acme/runs/{run.id}", {"log": "step", "step": "ask\x00"})
    assert response.status_code == 200
    assert "run_created" in response.content.decode()  # no step chosen: every event is shown


def _over_the_state_limit(settings) -> str:
    """A JSON object that parses and is stored fine, but merged into a run's state is over
    RUN_STATE_MAX_BYTES (the request itself stays under the upload limit)."""
    settings.RUN_STATE_MAX_BYTES = 20_000
    return json.dumps({"blob": "x" * 30_000})


def test_an_edited_artifact_too_large_for_the_runs_state_is_a_message_not_a_500(acme, settings):
    big = _over_the_state_limit(settings)
    with tenant_context(acme):
        run = finished(start("waiter", input={"how": "approval"}).id)
        approval = Approval.objects.get(run=run, status=Approval.Status.PENDING)
    client = signed_in(person(acme, "approver"))
    response = client.post(f"/t/acme/approvals/{approval.id}", {
        "decision": "approve_edited", "artifact": big})
    assert response.status_code == 409 and _said(response, "limit")
    with tenant_context(acme):
        assert Approval.objects.get(id=approval.id).status == Approval.Status.PENDING
        assert Run.objects.get(id=run.id).status == Run.Status.WAITING


def test_an_event_payload_too_large_for_the_runs_state_is_a_message_not_a_500(acme, settings):
    big = _over_the_state_limit(settings)
    key = uuid.uuid4().hex
    with tenant_context(acme):
        run = finished(start("waiter", input={"how": "event", "kind": "k.big", "key": key}).id)
    client = signed_in(person(acme, "operator"))
    response = client.post(f"/t/acme/runs/{run.id}/event", {"payload": big}, follow=True)
    assert _said(response, "limit")
    with tenant_context(acme):
        assert Run.objects.get(id=run.id).status == Run.Status.WAITING
        assert not InboundEvent.objects.filter(kind="k.big", key=key).exists()


def _nested(depth: int) -> dict:
    """{"a": {"a": ...}}, `depth` deep: a step can store this (it passes the model's output on)
    although the API would not take it."""
    value: dict = {}
    inner = value
    for _ in range(depth):
        inner["a"] = {}
        inner = inner["a"]
    return value


def _in_a_fresh_thread(call):
    """Serve the request on a thread of its own, as a WSGI server does: its stack starts empty,
    not below pytest's (deeper under pytest-xdist, whose frames alone sink a 900-deep load)."""
    answers = []

    def serve():
        try:
            answers.append(call())
        finally:
            connection.close()  # this thread's own

    thread = threading.Thread(target=serve)
    thread.start()
    thread.join(timeout=60)
    assert answers, "the request did not answer"
    return answers[0]


def test_one_deeply_nested_artifact_does_not_take_down_the_whole_inbox(acme):
    """The inbox shows every pending approval's artifact (compact JSON past four levels, and
    raw): an artifact 900 levels deep made json.dumps recurse past the interpreter's limit while
    the template rendered it, a 500 for every person of the tenant until it was decided."""
    with tenant_context(acme):
        plain = finished(start("waiter", input={"how": "approval"}).id)
        hostile = finished(start("waiter", input={"how": "approval"}).id)
        poisoned = Approval.objects.get(run=hostile, status=Approval.Status.PENDING)
        Approval.objects.filter(id=poisoned.id).update(
            request={"title": "Deep", "artifact": _nested(900)})
    try:
        client = signed_in(person(acme, "approver"))
        inbox = _in_a_fresh_thread(lambda: client.get("/t/acme/approvals"))
        assert inbox.status_code == 200
        assert str(plain.id)[:8] in inbox.content.decode()  # the other approvals are still there
        assert "nested too deeply to show" in inbox.content.decode()
    finally:  # the poison must not reach another test's inbox (loaded on a deeper stack)
        with tenant_context(acme):
            Approval.objects.filter(id=poisoned.id).update(request={"title": "Deep"})


def test_comparing_two_deeply_nested_states_is_a_message_not_a_500(acme, monkeypatch):
    """json_diff recurses once per level: two states nested past the interpreter's limit (as a
    step may store them) answered the diff with a RecursionError."""
    with tenant_context(acme):
        run = finished(start("waiter", input={"how": "approval"}).id)

    def deep_state(*, run_id, visit):
        return {"visit": visit, "step": "ask", "state": _nested(3000 + visit), "logs": {}}

    monkeypatch.setattr(run_views.services, "checkpoint_state", deep_state)
    client = signed_in(person(acme, "viewer"))
    response = client.get(f"/t/acme/runs/{run.id}", {"a": 0, "b": 1})
    assert response.status_code == 200
    assert _said(response, "nested too deeply to compare")
