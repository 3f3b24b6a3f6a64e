"""The approvals inbox and deciding in the dashboard: real runs parked on real approvals,
decided through the test client against the real database."""

import json
import re

import pytest
from django.template import Context, Template
from django_tenants.utils import tenant_context

from runs.approvals.models import Approval
from runs.models import Run, RunEvent
from runs.services import run_start
from tests.dashboard.conftest import person, signed_in
from tests.support.runs import finished, start
from tests.support.waiting import wait_for


def parked(tenant, **input) -> Approval:
    """A waiter run parked on its approval, in this process (no worker needed)."""
    with tenant_context(tenant):
        run = start("waiter", input={"how": "approval", **input})
        assert finished(run.id).status == Run.Status.WAITING
        return Approval.objects.get(run=run, status=Approval.Status.PENDING)


def state_of(tenant, approval: Approval) -> Approval:
    with tenant_context(tenant):
        return Approval.objects.get(id=approval.id)


def page(approval: Approval, tenant) -> str:
    return f"/t/{tenant.schema_name}/approvals/{approval.id}"


def test_the_inbox_shows_pending_approvals_newest_first_readably(acme, as_role):
    older, newer = parked(acme), parked(acme)
    response = as_role("viewer").get("/t/acme/approvals")
    assert response.status_code == 200
    html = response.content.decode()
    assert html.index(str(newer.id)) < html.index(str(older.id))
    assert "Ship it?" in html and "waiter v1" in html
    # the artifact {"plan": "v1"} as a definition list, not a blob (the raw view is extra)
    assert re.search(r'<dl class="kv json-object"><dt>plan</dt><dd><span class="json-string">'
                     r'v1</span></dd></dl>', html)
    assert "Decide<" not in html and "You may not decide this" in html  # a viewer decides nothing


def test_decided_approvals_are_a_filter_of_their_own(acme, as_role):
    waiting, closed = parked(acme), parked(acme)
    approver = as_role("approver")
    approver.post(page(closed, acme), {"decision": "reject", "comment": "not now"})
    pending = approver.get("/t/acme/approvals").content.decode()
    decided = approver.get("/t/acme/approvals?show=decided").content.decode()
    assert str(waiting.id) in pending and str(closed.id) not in pending
    assert str(closed.id) in decided and str(waiting.id) not in decided
    assert "not now" in decided


def test_an_approver_approves_an_edited_artifact_and_the_run_goes_on(acme, worker):
    approver = person(acme, "approver")
    with tenant_context(acme):
        run = run_start(agent="waiter", input={"how": "approval"}).run
    with tenant_context(acme):
        approval = wait_for(lambda: Approval.objects.filter(run_id=run.id).first(),
                            what="the run to park on its approval")
    client = signed_in(approver)
    form = client.get(page(approval, acme)).content.decode()
    assert 'name="artifact"' in form and "&quot;plan&quot;: &quot;v1&quot;" in form  # prefilled
    edited = {"plan": "v2", "steps": [{"day": 1, "do": "call"}, {"day": 2, "do": "write"}]}
    response = client.post(page(approval, acme), {
        "decision": "approve_edited", "artifact": json.dumps(edited), "comment": "tightened"})
    assert response.status_code == 302

    actor = f"user:{approver.username}"
    decided = state_of(acme, approval)
    assert decided.status == Approval.Status.APPROVED and decided.artifact == edited
    assert (decided.decided_by, decided.comment) == (actor, "tightened")
    with tenant_context(acme):
        event = RunEvent.objects.get(run_id=run.id, kind="approval_decided")
        assert event.data["by"] == actor and event.data["artifact"] == edited
        done = wait_for(lambda: (r := Run.objects.get(id=run.id)).status == "succeeded" and r,
                        timeout=30, what="the run to finish")
    assert done.result["artifact"] == edited and done.result["by"] == actor

    shown = client.get(page(approval, acme)).content.decode()
    assert "Recorded as " + actor in shown and "Artifact as approved" in shown
    assert '<th scope="col">day</th>' in shown  # a list of objects is a table
    assert 'name="decision"' not in shown  # decided: nothing more to decide


def test_invalid_json_decides_nothing_and_keeps_what_was_typed(acme, as_role):
    approval = parked(acme)
    typed = '{"plan": "v2",}'
    response = as_role("approver").post(page(approval, acme), {
        "decision": "approve_edited", "artifact": typed, "comment": "almost"})
    assert response.status_code == 400
    html = response.content.decode()
    assert "Not valid JSON" in html and "Nothing was decided" in html
    assert "{&quot;plan&quot;: &quot;v2&quot;,}" in html and "almost" in html
    assert state_of(acme, approval).status == Approval.Status.PENDING


@pytest.mark.parametrize("role", ["viewer", "operator"])
def test_roles_that_do_not_decide_see_no_buttons_and_get_403(acme, as_role, role):
    approval = parked(acme)
    client = as_role(role)
    html = client.get(page(approval, acme)).content.decode()
    assert 'name="decision"' not in html and "csrfmiddlewaretoken" not in html.split("<main")[1]
    assert client.post(page(approval, acme), {"decision": "approve"}).status_code == 403
    assert state_of(acme, approval).status == Approval.Status.PENDING


def test_a_role_decider_admits_that_role_only(acme):
    """`role:approver` names approvers: an admin (who may decide approvals) is role:admin."""
    approval = parked(acme, deciders=["role:approver"])
    admin = signed_in(person(acme, "admin"))
    html = admin.get(page(approval, acme)).content.decode()
    assert "You may not decide this" in html and 'name="decision"' not in html
    refused = admin.post(page(approval, acme), {"decision": "approve"})
    assert refused.status_code == 409 and "may not decide this approval" in refused.content.decode()
    assert state_of(acme, approval).status == Approval.Status.PENDING

    approver = person(acme, "approver")
    client = signed_in(approver)
    assert "You may decide" in client.get(page(approval, acme)).content.decode()
    assert client.post(page(approval, acme), {"decision": "reject"}).status_code == 302
    decided = state_of(acme, approval)
    assert (decided.status, decided.decided_by) == ("rejected", f"user:{approver.username}")


@pytest.mark.parametrize("named", ["user:{email}", "{email}"])
def test_a_person_named_as_decider_may_decide(acme, named):
    owner = person(acme, "owner")
    approval = parked(acme, deciders=[named.format(email=owner.username), "role:nobody"])
    other = signed_in(person(acme, "owner"))
    assert "You may not decide this" in other.get(page(approval, acme)).content.decode()
    assert other.post(page(approval, acme), {"decision": "approve"}).status_code == 409
    client = signed_in(owner)
    assert "You may decide" in client.get(page(approval, acme)).content.decode()
    assert client.post(page(approval, acme), {"decision": "approve"}).status_code == 302
    assert state_of(acme, approval).decided_by == f"user:{owner.username}"


def test_a_closed_approval_is_a_message_not_an_error(acme, as_role):
    approval = parked(acme)
    first, second = as_role("approver"), as_role("owner")
    assert "Approve" in second.get(page(approval, acme)).content.decode()
    assert first.post(page(approval, acme), {"decision": "approve"}).status_code == 302
    late = second.post(page(approval, acme), {"decision": "reject", "comment": "no"})
    assert late.status_code == 409
    assert "This approval is already approved." in late.content.decode()
    assert state_of(acme, approval).status == Approval.Status.APPROVED


def test_another_tenants_approval_is_404(acme, globex, as_role):
    theirs = parked(globex)
    client = as_role("owner")  # of acme
    assert client.get(page(theirs, acme)).status_code == 404
    assert client.post(page(theirs, acme), {"decision": "approve"}).status_code == 404
    assert client.get(page(theirs, globex)).status_code == 404  # not a member of globex
    assert str(theirs.id) not in client.get("/t/acme/approvals").content.decode()
    assert state_of(globex, theirs).status == Approval.Status.PENDING


@pytest.mark.parametrize("kind, approve, reject", [
    ("effect_outcome", "Delivered", "Not delivered"),
    ("budget", "Raise the budget", "Fail the run")])
def test_other_kinds_say_what_deciding_means_and_cannot_be_edited(acme, as_role, kind, approve,
                                                                   reject):
    approval = parked(acme)
    with tenant_context(acme):  # the request such an approval carries, on a parked run
        Approval.objects.filter(id=approval.id).update(
            kind=kind, request={"title": "Did 'welcome' go out?", "effect": "welcome"})
    client = as_role("approver")
    html = client.get(page(approval, acme)).content.decode()
    assert f">{approve}</button>" in html and f">{reject}</button>" in html
    assert 'name="artifact"' not in html and "<dt>effect</dt>" in html
    response = client.post(page(approval, acme), {"decision": "approve_edited",
                                                  "artifact": "{}"})
    assert response.status_code == 400
    assert state_of(acme, approval).status == Approval.Status.PENDING


def test_expiry_is_shown_in_words(acme, as_role):
    approval = parked(acme, timeout=7200)
    html = as_role("viewer").get("/t/acme/approvals").content.decode()
    assert re.search(r"expires in (1|2).hour", html)
    with tenant_context(acme):
        Approval.objects.filter(id=approval.id).update(expires_at=approval.created_at)
    html = as_role("approver").get(page(approval, acme)).content.decode()
    assert "expired" in html and 'name="decision"' not in html


def render(value) -> str:
    return Template("{% load readable_json %}{{ value|readable_json }}").render(
        Context({"value": value}))


def test_readable_json_shapes_and_escapes():
    assert render({"a": 1, "b": True, "c": None}) == (
        '<dl class="kv json-object"><dt>a</dt><dd><span class="json-number">1</span></dd>'
        '<dt>b</dt><dd><span class="json-bool">true</span></dd>'
        '<dt>c</dt><dd><span class="json-null">null</span></dd></dl>')
    table = render([{"to": "a@x", "n": 1}, {"to": "b@x"}])
    assert '<th scope="col">to</th><th scope="col">n</th>' in table and "<td></td>" in table
    assert render(["x", ["y"]]).startswith('<ul class="json-list"><li>')
    hostile = render({"<script>": ["<img src=x onerror=alert(1)>"]})
    assert "<script>" not in hostile and "<img" not in hostile
    assert "&lt;script&gt;" in hostile and "&lt;img src=x" in hostile
    deep = render({"a": {"b": {"c": {"d": {"e": 1}}}}})
    assert '<code class="json-deep">{&quot;e&quot;: 1}</code>' in deep
    assert "… and 5 more" in render(list(range(105)))
