"""The issue's end-to-end story in a real browser, against a live server with real workers and a
real SMTP server: an owner invites a person by email, the person sets a password from the
emailed link, signs in, starts the onboarding demo from the runs page, sends `docs.signed` from
the run's page, watches it park on the manager's approval, approves an edited day-one schedule in
the approvals inbox, sends `hardware.delivered`, and sees the run finish with both emails in its
effects list. Also: a viewer cannot decide; a tenant's two-factor requirement blocks sign-in
without the code.

These drive the pages of the members, runs, run and approvals areas (built on their own
branches, dash-people, dash-runslist, dash-runpage, dash-inbox): the selectors are the
accessible names those pages give (labels, button and link names, headings, regions), read from
those branches before the merge. Where a name changes, change it here, not the page's
accessibility."""

import json
import re
import uuid

import pytest
from django.db import connection
from django_otp.oath import totp
from django_otp.plugins.otp_totp.models import TOTPDevice
from django_tenants.utils import tenant_context
from playwright.sync_api import Page, expect

from runs.approvals.models import Approval
from runs.effects.models import Effect
from runs.models import Run
from runs.services import run_start
from tenants.models import Membership
from tenants.services import tenant_create, tenant_delete
from tests.browser.conftest import PASSWORD, person, sign_in
from tests.support.waiting import wait_for

EDITED_TALK = "Pairing with your buddy on a first small change"


def section(page: Page, name: str) -> None:
    """Follow a link of the header's navigation (Runs, Approvals, Agents, Settings)."""
    page.get_by_role("navigation", name="Sections").get_by_role("link", name=name).click()


def send_event(page: Page, kind: str, key: str, payload: dict | None = None) -> None:
    """The run page's form for the event a waiting run waits for (kind and key filled in)."""
    expect(page.get_by_label("Kind", exact=True)).to_have_value(kind)
    expect(page.get_by_label("Key", exact=True)).to_have_value(key)
    page.get_by_label(re.compile("payload", re.I)).fill(json.dumps(payload or {}))
    page.get_by_role("button", name="Send the event").click()


def header(page: Page):
    """The run page's header: where the run stands, in words (refreshed live)."""
    return page.get_by_role("region", name="Where it stands")


def run_of(tenant, run_id) -> Run:
    with tenant_context(tenant):
        return Run.objects.get(id=run_id)


def mail_to(smtp, address: str, subject_has: str = ""):
    found = [m for m in list(smtp.messages) if address in (m["To"] or "")
             and subject_has in (m["Subject"] or "")]
    return found[-1] if found else None


def test_an_invited_person_runs_the_onboarding_demo_to_its_end_in_the_browser(
        open_page, dashboard_server, browser_tenant, smtp, worker):
    tenant = browser_tenant.schema_name
    invitee = f"manager-{uuid.uuid4().hex[:6]}@example.test"
    employee = f"ada-{uuid.uuid4().hex[:6]}@{tenant}.test"

    # 1. The owner invites a person by email, as an owner, from the members page.
    owner_page = open_page()
    sign_in(owner_page, person(browser_tenant, "owner"))
    section(owner_page, "Members")
    invite = owner_page.get_by_role("region", name="Invite someone")
    invite.get_by_label("Email").fill(invitee)
    invite.get_by_label("Role").select_option("owner")  # starts runs and decides approvals
    invite.get_by_role("button", name="Send the invitation").click()
    expect(owner_page.get_by_role("status")).to_contain_text(invitee)
    expect(owner_page.get_by_role("region", name="Open invitations")).to_contain_text(invitee)

    # 2. The email arrives at the SMTP server with a link to this dashboard.
    wait_for(lambda: mail_to(smtp, invitee), timeout=30, what="the invitation email")
    body = mail_to(smtp, invitee).get_body(preferencelist=("plain",)).get_content()
    link = re.search(rf"{re.escape(dashboard_server.url)}/\S+", body)
    assert link, body

    # 3. The person follows it and sets a password; then signs in with it, in a browser of
    # their own.
    page = open_page()
    page.goto(link.group(0))
    expect(page.get_by_role("heading", level=1)).to_contain_text(re.compile("invit|join", re.I))
    page.get_by_label(re.compile(r"^(new )?password$", re.I)).fill(PASSWORD)
    page.get_by_label(re.compile("confirm|again", re.I)).fill(PASSWORD)
    page.get_by_role("button", name=re.compile("join", re.I)).click()
    expect(page.get_by_role("status")).to_contain_text("Welcome")
    assert Membership.objects.filter(tenant=browser_tenant, user__username=invitee).exists()
    page = open_page()
    sign_in(page, invitee)
    expect(page).to_have_url(re.compile(rf"/t/{tenant}/runs$"))

    # 4. The onboarding demo, started from the runs page's form (the agent's input as JSON).
    page.get_by_role("link", name="Start a run").click()
    page.get_by_label("Agent", exact=True).select_option("onboarding")
    page.get_by_label("Input (JSON)").fill(json.dumps({
        "employee": {"name": "Ada Lovelace", "email": employee}, "it_email": f"it@{tenant}.test",
        "start_date": "next Monday", "manager": f"user:{invitee}"}))
    page.get_by_role("button", name="Start the run").click()
    expect(page).to_have_url(re.compile(rf"/t/{tenant}/runs/[0-9a-f-]{{36}}$"))
    run_id = page.url.rstrip("/").rsplit("/", 1)[1]
    expect(page.get_by_role("heading", level=1)).to_contain_text("Run of onboarding")
    expect(header(page)).to_contain_text(  # the header refreshes itself: no reload
        re.compile(r"waits for the event\s*docs\.signed"), timeout=30_000)
    page.reload()  # the actions (the event form among them) are drawn when the page loads

    # 5. The new hire has signed: the event, sent from the run's page.
    send_event(page, "docs.signed", employee, {"signed": True})
    wait_for(lambda: run_of(browser_tenant, run_id).waiting_reason.startswith("approval"),
             timeout=60, what="the run to park on the manager's approval")
    page.reload()
    expect(header(page)).to_contain_text("It waits for a decision: Day-one schedule for Ada Lovelace")

    # 6. The approvals inbox: the schedule shown readably (not a JSON blob), edited, approved.
    section(page, "Approvals")
    page.get_by_role("link", name="Day-one schedule for Ada Lovelace", exact=True).click()
    expect(page.get_by_role("heading", level=1, name="Day-one schedule for Ada Lovelace")
           ).to_be_visible()
    expect(page.get_by_text("Welcome breakfast with the team").first).to_be_visible()  # readable
    with tenant_context(browser_tenant):
        schedule = dict(Approval.objects.get(run_id=run_id, status="pending").request["artifact"])
    page.get_by_text("Approve an edited artifact").click()  # opens the JSON editor
    editor = page.get_by_label("Artifact (JSON)")
    approve_edited = page.get_by_role("button", name="Approve with these edits")
    editor.fill("{not json")  # checked before sending: said inline, nothing can be sent
    expect(page.get_by_text(re.compile("Not valid JSON")).first).to_be_visible()
    expect(approve_edited).to_be_disabled()
    assert run_of(browser_tenant, run_id).waiting_reason.startswith("approval")
    editor.fill(json.dumps({**schedule, "14:00": EDITED_TALK}))
    page.get_by_label(re.compile("comment", re.I)).fill("Pairing beats a tour.")
    approve_edited.click()
    expect(page.get_by_role("status")).to_contain_text(f"Recorded as user:{invitee}")
    wait_for(lambda: "hardware.delivered" in run_of(browser_tenant, run_id).waiting_reason,
             timeout=60, what="the run to wait for the hardware")
    with tenant_context(browser_tenant):
        decided = Approval.objects.get(run_id=run_id, status="approved")
    assert decided.decided_by == f"user:{invitee}"

    # 7. The hardware arrives; the run finishes with both emails in its effects list.
    page.goto(f"/t/{tenant}/runs/{run_id}")
    send_event(page, "hardware.delivered", employee)
    wait_for(lambda: run_of(browser_tenant, run_id).status == Run.Status.SUCCEEDED, timeout=60,
             what="the run to finish")
    page.reload()
    expect(header(page)).to_contain_text("succeeded")
    effects = page.get_by_role("region", name="Effects", exact=True)
    for name in ("welcome_packet", "day_one_schedule"):
        expect(effects.get_by_role("row").filter(has_text=name)).to_contain_text("done")

    # 8. Both emails reached the SMTP server, the schedule with the approved edit in it.
    assert mail_to(smtp, employee, "Welcome aboard")
    schedule_mail = mail_to(smtp, employee, "Your first day")
    assert schedule_mail, [m["Subject"] for m in smtp.messages]
    schedule_body = schedule_mail.get_body(preferencelist=("plain",)).get_content()
    assert f"14:00: {EDITED_TALK}" in schedule_body
    assert "codebase tour" not in schedule_body
    with tenant_context(browser_tenant):
        assert sorted(Effect.objects.filter(run_id=run_id, connector="email", status="done")
                      .values_list("name", flat=True)) == ["day_one_schedule", "welcome_packet"]


def test_a_viewer_sees_no_decision_buttons_and_a_decision_posted_anyway_is_403(
        open_page, dashboard_server, browser_tenant, worker):
    with tenant_context(browser_tenant):
        run = run_start(agent="waiter", input={"how": "approval"}).run
        wait_for(lambda: Approval.objects.filter(run_id=run.id, status="pending").exists(),
                 timeout=30, what="the run to ask for its approval")
        approval = Approval.objects.get(run_id=run.id)
    page = open_page()
    sign_in(page, person(browser_tenant, "viewer"))
    section(page, "Approvals")
    page.get_by_role("link", name="Ship it?").first.click()  # newest first: this run's
    expect(page.get_by_role("heading", level=1, name="Ship it?")).to_be_visible()
    expect(page.get_by_text("v1").first).to_be_visible()  # the artifact, readable to a viewer
    expect(page.get_by_text("You may not decide this.")).to_be_visible()
    expect(page.get_by_role("button", name=re.compile("approve|reject", re.I))).to_have_count(0)

    csrf = next(c["value"] for c in page.context.cookies() if c["name"] == "csrftoken")
    answer = page.request.post(f"/t/{browser_tenant.schema_name}/approvals/{approval.id}",
                               form={"decision": "approve"},
                               headers={"X-CSRFToken": csrf, "Referer": dashboard_server.url + "/"})
    assert answer.status == 403, answer.status
    with tenant_context(browser_tenant):
        assert Approval.objects.get(id=approval.id).status == "pending"


@pytest.fixture
def two_factor_tenant(django_db_blocker, s3):
    """A tenant of its own whose owner requires two-factor sign-in (dropped afterwards)."""
    schema = f"browser2fa{uuid.uuid4().hex[:4]}"
    tenant = tenant_create(schema_name=schema).tenant
    tenant.require_2fa = True
    tenant.save(update_fields=["require_2fa"])
    connection.set_schema_to_public()
    yield tenant
    tenant_delete(tenant=tenant)
    connection.set_schema_to_public()


def test_a_tenant_requiring_two_factor_is_closed_without_the_code(open_page, two_factor_tenant):
    user = person(two_factor_tenant, "owner")
    device = TOTPDevice.objects.create(user=user, name="phone", confirmed=True)
    runs = f"/t/{two_factor_tenant.schema_name}/runs"
    page = open_page()
    sign_in(page, user)  # the password alone: signed in, but not into this tenant
    page.goto(runs)
    code = page.get_by_label(re.compile("code", re.I))
    expect(code).to_be_visible()
    expect(page.get_by_role("heading", level=1, name="Runs")).to_have_count(0)

    right = totp(device.bin_key, step=device.step, t0=device.t0, digits=device.digits)
    code.fill(f"{(right + 1) % 10 ** device.digits:0{device.digits}d}")  # a wrong code
    page.get_by_role("button", name="Verify").click()
    expect(page.get_by_label(re.compile("code", re.I))).to_have_attribute("aria-invalid", "true")
    page.goto(runs)
    expect(page.get_by_role("heading", level=1, name="Runs")).to_have_count(0)

    # django-otp makes a device wait after a wrong code (1 s, doubling); as if that wait passed:
    TOTPDevice.objects.filter(id=device.id).update(throttling_failure_count=0)
    page.get_by_label(re.compile("code", re.I)).fill(f"{right:0{device.digits}d}")
    page.get_by_role("button", name="Verify").click()
    expect(page).to_have_url(re.compile(rf"{runs}$"))
    expect(page.get_by_role("heading", level=1, name="Runs")).to_be_visible()
