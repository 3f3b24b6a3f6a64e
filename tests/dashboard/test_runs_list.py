"""The Runs page: filters, the live rows partial, bulk cancel and re-queue, starting a run.

Tests share the database: each one marks its runs with a token of its own in their input and
narrows the list by it."""

import datetime as dt
import json
import re
import uuid

import pytest
from django.contrib.messages import get_messages
from django.utils import timezone
from django_tenants.utils import tenant_context

from agentplatform.errors import ServiceError
from runs.models import Run
from runs.selectors import run_event_list, run_list
from tests.support.runs import finished, start

from .conftest import person, signed_in


def token() -> str:
    return f"tok{uuid.uuid4().hex[:10]}"


def listed(client, **query) -> set[str]:
    """The run ids on the first page of the list for `query`."""
    response = client.get("/t/acme/runs", query)
    assert response.status_code == 200
    return set(re.findall(r'data-run="([0-9a-f-]{36})"', response.content.decode()))


def ended(run: Run, status: str, result=None) -> Run:
    Run.objects.filter(id=run.id).update(status=status, finished_at=timezone.now(), result=result)
    run.refresh_from_db()
    return run


def texts(response) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


# -- the list and its filters ---------------------------------------------------------------

def test_each_filter_narrows_the_list(acme, as_role):
    tag, other = token(), token()
    with tenant_context(acme):
        queued = start("research", input={"topic": tag})
        done = ended(start("research", input={"topic": tag}), "succeeded", {"note": other})
        failed = ended(start("chatter", input={"tag": tag}), "failed")
        old = start("research", input={"topic": tag})
        Run.objects.filter(id=old.id).update(created_at=dt.datetime(2020, 1, 1, tzinfo=dt.UTC))
    everyone = {str(r.id) for r in (queued, done, failed, old)}
    client = as_role("viewer")

    assert listed(client, text=tag) == everyone
    assert listed(client, text=tag.upper()) == everyone  # case-insensitive
    assert listed(client, text=other) == {str(done.id)}  # found in the result
    assert not listed(client, text=f"{tag[:3]}%{tag[-3:]}")  # % is a literal, not a wildcard
    assert listed(client, text=tag, status=["succeeded", "failed"]) == {str(done.id), str(failed.id)}
    assert listed(client, text=tag, agent="chatter") == {str(failed.id)}
    assert listed(client, text=tag, version="1") == everyone
    assert listed(client, text=tag, version="2") == set()
    assert listed(client, text=tag, created_to="2021-01-01T00:00") == {str(old.id)}
    assert listed(client, text=tag, created_from="2021-01-01T00:00") == everyone - {str(old.id)}


def test_what_a_waiting_run_waits_for(acme, as_role):
    tag = token()
    with tenant_context(acme):
        waits = {
            "approval": finished(start("waiter", input={"how": "approval", "tag": tag}).id),
            "event": finished(start("waiter", input={"how": "event", "kind": "x.y", "key": tag,
                                                     "tag": tag}).id),
            "timer": finished(start("waiter", input={"how": "sleep", "seconds": 3600,
                                                     "tag": tag}).id),
            # a child wait is a gate on the child's id, of kind child_run; opened here without
            # a real child, which a session's worker would run to its end under the test
            "child": finished(start("waiter", input={"how": "event", "kind": "child_run",
                                                     "key": str(uuid.uuid4()), "tag": tag}).id),
        }
        # an approval with a timeout also has a wakeup: it waits for the approval, not a timer
        timed = finished(start("waiter", input={"how": "approval", "timeout": 3600,
                                                "tag": tag}).id)
    assert {run.status for run in waits.values()} == {"waiting"}
    client = as_role("viewer")
    for kind, run in waits.items():
        expected = {str(run.id)} | ({str(timed.id)} if kind == "approval" else set())
        assert listed(client, text=tag, waiting_for=kind) == expected, kind
    assert listed(client, text=tag, waiting_for=["event", "child"]) == {
        str(waits["event"].id), str(waits["child"].id)}


def test_bad_filter_values_are_shown_and_the_page_still_renders(acme, as_role):
    client = as_role("viewer")
    response = client.get("/t/acme/runs", {"status": "bogus", "created_from": "yesterday-ish",
                                           "version": "x", "waiting_for": "godot"})
    assert response.status_code == 200
    page = response.content.decode()
    assert "bogus is not one of the available choices" in page
    assert "Enter a valid date/time" in page and "Enter a whole number" in page
    backwards = client.get("/t/acme/runs", {"created_from": "2025-01-02T00:00",
                                            "created_to": "2025-01-01T00:00"})
    assert backwards.status_code == 200 and "must be before" in backwards.content.decode()


def test_the_selector_refuses_unknown_filters(in_acme):
    with pytest.raises(ServiceError, match="unknown wait") as refused:
        run_list(waiting_for=["godot"])
    assert refused.value.code == "invalid_filter"


def test_an_htmx_request_gets_only_the_rows_with_the_same_filters(acme, as_role):
    tag = token()
    with tenant_context(acme):
        mine = start("research", input={"topic": tag})
    client = as_role("viewer")
    page = client.get("/t/acme/runs", {"text": tag})
    html = page.content.decode()
    assert 'hx-trigger="every 2s"' in html and f'hx-get="/t/acme/runs?text={tag}"' in html
    assert 'aria-pressed="false"' in html and "Pause live updates" in html
    rows = client.get("/t/acme/runs", {"text": tag}, HTTP_HX_REQUEST="true")
    body = rows.content.decode()
    assert rows.status_code == 200 and "<html" not in body and "<tbody" not in body
    assert f'data-run="{mine.id}"' in body and "status-queued" in body
    with tenant_context(acme):
        ended(mine, "succeeded")
    again = client.get("/t/acme/runs", {"text": tag}, HTTP_HX_REQUEST="true").content.decode()
    assert 'class="status status-succeeded">succeeded<' in again


def test_pages_are_newest_first_and_capped(acme, as_role):
    tag = token()
    with tenant_context(acme):
        runs = [start("research", input={"topic": tag}) for _ in range(3)]
    client = as_role("viewer")
    html = client.get("/t/acme/runs", {"text": tag}).content.decode()
    order = re.findall(r'data-run="([0-9a-f-]{36})"', html)
    assert order == [str(r.id) for r in reversed(runs)]
    deep = client.get("/t/acme/runs", {"page": "100000"})
    assert deep.status_code == 200 and "less than or equal to 200" in deep.content.decode()


# -- bulk actions ---------------------------------------------------------------------------

def test_bulk_cancel_asks_with_a_count_then_cancels_exactly_the_selected(acme):
    tag = token()
    with tenant_context(acme):
        picked = [start("research", input={"topic": tag}) for _ in range(3)]
        spared = start("research", input={"topic": tag})
        over = ended(start("research", input={"topic": tag}), "succeeded")
    operator = person(acme, "operator")
    client = signed_in(operator)
    ids = [str(r.id) for r in picked] + [str(over.id)]

    confirm = client.post("/t/acme/runs/bulk", {"action": "cancel", "run": ids,
                                                "query": f"text={tag}"})
    assert confirm.status_code == 200
    assert "Cancel 4 runs?" in confirm.content.decode()
    with tenant_context(acme):
        assert set(run_list(text=tag).values_list("status", flat=True)) == {"queued", "succeeded"}

    done = client.post("/t/acme/runs/bulk", {"action": "cancel", "run": ids, "confirm": "1",
                                             "query": f"text={tag}"})
    assert done.status_code == 302 and done["Location"] == f"/t/acme/runs?text={tag}"
    assert texts(done) == ["3 runs cancelled.", "1 run not cancelled: run is already succeeded."]
    with tenant_context(acme):
        for run in picked:
            run.refresh_from_db()
            assert run.status == "cancelled"
            cancelled = run_event_list(run_id=run.id).get(kind="run_cancelled")
            assert cancelled.data["by"] == f"user:{operator.username}"
        spared.refresh_from_db()
        over.refresh_from_db()
        assert (spared.status, over.status) == ("queued", "succeeded")


def test_bulk_requeue_reports_runs_that_wait_on_an_approval(acme):
    tag = token()
    with tenant_context(acme):
        stuck = start("research", input={"topic": tag})
        parked = finished(start("waiter", input={"how": "approval", "tag": tag}).id)
    admin = person(acme, "admin")
    client = signed_in(admin)
    done = client.post("/t/acme/runs/bulk", {"action": "requeue", "confirm": "1",
                                             "run": [str(stuck.id), str(parked.id)]})
    assert done.status_code == 302
    [ok, refused] = texts(done)
    assert ok == "1 run re-queued." and refused.startswith("1 run not re-queued: the run waits")
    with tenant_context(acme):
        assert run_event_list(run_id=stuck.id).get(kind="operator_requeued").data["by"] == \
            f"user:{admin.username}"
        parked.refresh_from_db()
        assert parked.status == "waiting"


def test_another_tenants_run_in_a_bulk_action_is_not_found_and_not_touched(acme, globex):
    with tenant_context(globex):
        theirs = start("research", input={"topic": token()})
    client = signed_in(person(acme, "owner"))
    confirm = client.post("/t/acme/runs/bulk", {"action": "cancel", "run": [str(theirs.id)]})
    assert "1 selected run was not found" in confirm.content.decode()
    done = client.post("/t/acme/runs/bulk", {"action": "cancel", "confirm": "1",
                                             "run": [str(theirs.id), "not-a-uuid"]})
    assert done.status_code == 302 and texts(done) == ["2 runs not found."]
    with tenant_context(globex):
        theirs.refresh_from_db()
        assert theirs.status == "queued"
        assert not run_event_list(run_id=theirs.id).filter(kind="run_cancelled").exists()


def test_a_bulk_post_without_runs_or_action_is_an_error_message(acme, as_role):
    assert texts(as_role("operator").post("/t/acme/runs/bulk", {"action": "cancel"})) == [
        "Select at least one run."]
    unknown = {"action": "explode", "run": [str(uuid.uuid4())]}
    assert texts(as_role("operator").post("/t/acme/runs/bulk", unknown)) == [
        "Choose an action: cancel or re-queue."]


@pytest.mark.parametrize("role", ["viewer", "approver"])
def test_viewers_and_approvers_see_no_actions_and_get_403(acme, as_role, role):
    with tenant_context(acme):
        run = start("research", input={"topic": token()})
    client = as_role(role)
    html = client.get("/t/acme/runs").content.decode()
    assert 'name="run"' not in html and 'id="bulk"' not in html and "Start a run" not in html
    assert client.post("/t/acme/runs/bulk", {"action": "cancel", "confirm": "1",
                                             "run": [str(run.id)]}).status_code == 403
    assert client.get("/t/acme/runs/start").status_code == 403
    assert client.post("/t/acme/runs/start", {"agent": "research"}).status_code == 403
    with tenant_context(acme):
        run.refresh_from_db()
        assert run.status == "queued"


def test_an_operator_sees_checkboxes_and_actions(acme, as_role):
    with tenant_context(acme):
        start("research", input={"topic": token()})
    html = as_role("operator").get("/t/acme/runs").content.decode()
    assert 'name="run"' in html and 'id="bulk"' in html and 'data-select-all' in html
    assert 'href="/t/acme/runs/start"' in html


# -- starting a run -------------------------------------------------------------------------

def start_form(client, **fields):
    page = client.get("/t/acme/runs/start", {"agent": fields.get("agent", "research")})
    key = re.search(r'name="idempotency_key" value="([0-9a-f-]+)"', page.content.decode())[1]
    return {"agent": "research", "durability": "sync", "version": "", "idempotency_key": key,
            **fields}


def test_the_start_form_lists_latest_agents_and_prefills_the_example(acme, as_role):
    client = as_role("operator")
    page = client.get("/t/acme/runs/start", {"agent": "onboarding"}).content.decode()
    assert '<option value="onboarding" selected>onboarding (v1)</option>' in page
    assert "Ada Lovelace" in page  # the onboarding example, in the textarea
    assert 'id="agent-examples"' in page and "Input schema of onboarding" in page
    assert '<label for="id_input">Input (JSON)</label>' in page


def test_bad_json_is_shown_next_to_the_input_and_starts_nothing(acme):
    tag = token()
    client = signed_in(person(acme, "operator"))
    typed = '{"topic": "' + tag + '", oops}'
    response = client.post("/t/acme/runs/start", start_form(client, input=typed))
    html = response.content.decode()
    assert response.status_code == 200 and "Not valid JSON" in html
    assert f'{{&quot;topic&quot;: &quot;{tag}&quot;, oops}}' in html  # the typed text, kept
    not_an_object = client.post("/t/acme/runs/start", start_form(client, input="[1, 2]"))
    assert "must be a JSON object" in not_an_object.content.decode()
    with tenant_context(acme):
        assert not run_list(text=tag).exists()


def test_input_that_breaks_the_agents_schema_is_shown_with_its_paths(acme):
    tag = token()
    client = signed_in(person(acme, "operator"))
    typed = json.dumps({"employee": {"name": tag}, "hardware_timeout_seconds": "soon"})
    response = client.post("/t/acme/runs/start",
                           start_form(client, agent="onboarding", input=typed))
    html = response.content.decode()
    assert response.status_code == 200
    assert "$.employee: &#x27;email&#x27; is a required property" in html
    assert "$.hardware_timeout_seconds: &#x27;soon&#x27; is not of type &#x27;number&#x27;" in html
    assert 'class="field invalid"' in html and tag in html
    with tenant_context(acme):
        assert not run_list(text=tag).exists()


def test_a_started_run_is_recorded_with_who_and_a_double_submit_starts_one(acme):
    tag = token()
    operator = person(acme, "operator")
    client = signed_in(operator)
    form = start_form(client, input=json.dumps({"topic": tag, "iterations": 1}), durability="async")
    first = client.post("/t/acme/runs/start", form)
    again = client.post("/t/acme/runs/start", form)
    assert first.status_code == again.status_code == 302
    assert first["Location"] == again["Location"]
    assert first["Location"].startswith("/t/acme/runs")
    with tenant_context(acme):
        [run] = run_list(text=tag)
        assert (run.agent, run.durability, run.input) == ("research", "async",
                                                          {"topic": tag, "iterations": 1})
        assert run.idempotency_key == form["idempotency_key"]
        created = run_event_list(run_id=run.id).get(kind="run_created")
        assert created.data["by"] == f"user:{operator.username}"
    # the same form sent again with other values: a new key, and nothing started yet
    changed = client.post("/t/acme/runs/start", {**form, "input": json.dumps({"topic": f"{tag}-2"})})
    assert changed.status_code == 200 and "already used" in changed.content.decode()
    assert form["idempotency_key"] not in changed.content.decode()


def test_an_unknown_version_is_shown_on_the_form(acme, as_role):
    client = as_role("operator")
    response = client.post("/t/acme/runs/start", start_form(client, version="99", input="{}"))
    assert response.status_code == 200 and "version 99 is not registered" in response.content.decode()
