"""axe-core and the 390-pixel check on every page of the dashboard, at 1280 and 390 pixels wide:
each page in the states a person meets it in (with filters applied, with an error shown, with
the edit form open, waiting, failed, finished), signed in as an owner (who sees every action
and every settings page), and the account pages signed out.

The data the pages show is made once for the module (`pages_data`): runs a real worker takes
to their ends (finished, failed, waiting on an event, an approval decided), a run parked in
this process on an approval whose artifact is a nested object (the agent is this module's, so
no worker picks it up), an invitation, and an account without two-factor to enrol.

Each case fails on any serious or critical axe violation and on sideways scrolling at 390 px
(`document.documentElement.scrollWidth <= innerWidth`)."""

import json
import uuid
from dataclasses import dataclass

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.tokens import default_token_generator
from django.utils.encoding import force_bytes
from django.utils.http import urlsafe_base64_encode
from django_tenants.utils import tenant_context
from playwright.sync_api import Page, expect

from runs.agents import Agent
from runs.approvals.models import Approval
from runs.approvals.services import approval_decide
from runs.models import Run
from runs.selectors import checkpoint_list
from runs.services import run_start
from runs.transitions import finish, wait_for_approval
from tenants.people import invitation_create
from tests.browser.conftest import VIEWPORTS, axe_check, person, sign_in
from tests.support import runs as driven
from tests.support.waiting import wait_for

# An approval whose artifact nests objects and lists (how the approval page draws it readably).
planner = Agent("a11y_planner", version=1)
NESTED = {"trip": {"to": "Lisbon", "nights": 3,
                   "flights": [{"out": "LHR 07:40", "id": "TP1351-" + "x" * 60},
                               {"back": "LIS 19:05", "seats": ["12A", "12B"]}]},
          "budget": {"total": 1840.5, "currency": "EUR", "approved_by": None}}


@planner.step(start=True, next=["booked"])
def plan(ctx, state):
    return wait_for_approval({"title": "Book the Lisbon trip?", "artifact": NESTED}, then="booked")


@planner.step(next=[])
def booked(ctx, state):
    return finish({"booked": True})


@dataclass
class Data:
    tenant: str
    finished: Run
    failed: Run
    waiting: Run
    asking: Run
    pending: Approval
    decided: Approval
    diff: tuple[int, int]
    invite_token: str
    owner: object
    newcomer: object


_made: dict = {}


@pytest.fixture
def pages_data(browser_tenant, worker) -> Data:
    """Made on the first test that asks, then shared by the module's tests (the worker fixture is
    per test, so this cannot be module-scoped; the runs it makes are the same ones)."""
    if "data" in _made:
        return _made["data"]
    tenant = browser_tenant.schema_name
    key = f"a11y-{uuid.uuid4().hex[:8]}"
    with tenant_context(browser_tenant):
        finished = run_start(agent="chatter", input={"steps": 3}).run
        failed = run_start(agent="rulebreaker", input={"how": "fails"}).run
        waiting = run_start(agent="waiter", input={"how": "event", "kind": "a11y.go", "key": key}).run
        to_decide = run_start(agent="waiter", input={"how": "approval"}).run
        asking = driven.finished(driven.start("a11y_planner", input={"trip": "Lisbon"}).id)
        wait_for(lambda: Run.objects.get(id=finished.id).status == Run.Status.SUCCEEDED
                 and Run.objects.get(id=failed.id).status == Run.Status.FAILED
                 and Run.objects.get(id=waiting.id).status == Run.Status.WAITING
                 and Approval.objects.filter(run_id=to_decide.id, status="pending").exists(),
                 timeout=60, what="the worker to finish, fail and park the runs")
        decided = approval_decide(approval_id=Approval.objects.get(run_id=to_decide.id).id,
                                  approve=False, by="user:someone@browser.test",
                                  comment="Not this week.")
        pending = Approval.objects.get(run_id=asking.id, status="pending")
        visits = [c.visit for c in checkpoint_list(run_id=finished.id)]
    owner = person(browser_tenant, "owner")
    invited = invitation_create(tenant=browser_tenant, email=f"new-{uuid.uuid4().hex[:6]}@a11y.test",
                                role="viewer", by="test")
    _made["data"] = Data(
        tenant=tenant, finished=finished, failed=failed,
        waiting=waiting, asking=asking, pending=pending, decided=decided,
        diff=(visits[0], visits[-1]), invite_token=invited.token, owner=owner,
        newcomer=person(browser_tenant, "viewer"))
    return _made["data"]


@pytest.fixture
def owner_state(chromium, dashboard_server, pages_data):
    """The owner's signed-in cookies, signed in once through the form for the module."""
    if "state" not in _made:
        context = chromium.new_context(base_url=dashboard_server.url)
        page = context.new_page()
        sign_in(page, pages_data.owner)
        _made["state"] = context.storage_state()
        context.close()
    return _made["state"]


# -- the pages: each opens its page (and puts it in the state to check) ------------------------

def t(d: Data, rest: str = "") -> str:
    return f"/t/{d.tenant}/{rest}"


def runs_filtered(page: Page, d: Data):
    page.goto(t(d, "runs?status=succeeded&status=failed&agent=chatter&text=message"))
    expect(page.get_by_role("table")).to_be_visible()


def runs_error(page: Page, d: Data):
    page.goto(t(d, "runs?created_from=2026-02-01T10:00&created_to=2026-01-01T10:00&version=0"))
    expect(page.get_by_role("alert").first).to_be_visible()


def runs_bulk_confirm(page: Page, d: Data):
    page.goto(t(d, "runs?agent=chatter"))
    page.get_by_label("Select all runs on this page").check()
    page.get_by_role("button", name="Apply…").click()
    expect(page.get_by_role("heading", level=1)).to_contain_text("ancel")


def start_form(page: Page, d: Data):
    page.goto(t(d, "runs/start"))
    expect(page.get_by_role("button", name="Start the run")).to_be_visible()


def start_form_json_error(page: Page, d: Data):
    page.goto(t(d, "runs/start"))
    page.get_by_label("Input (JSON)").fill('{"steps": 3,')
    page.get_by_role("button", name="Start the run").click()
    expect(page.get_by_text("Not valid JSON").first).to_be_visible()


def run_waiting(page: Page, d: Data):
    page.goto(t(d, f"runs/{d.waiting.id}"))
    expect(page.get_by_role("region", name="Where it stands")).to_contain_text("waits")


def run_asking(page: Page, d: Data):
    page.goto(t(d, f"runs/{d.asking.id}"))
    expect(page.get_by_role("region", name="Where it stands")).to_contain_text("decision")


def run_failed(page: Page, d: Data):
    page.goto(t(d, f"runs/{d.failed.id}"))
    expect(page.get_by_role("region", name="Where it stands")).to_contain_text("failed")


def run_finished_with_diff(page: Page, d: Data):
    a, b = d.diff
    page.goto(t(d, f"runs/{d.finished.id}?a={a}&b={b}#checkpoints"))
    expect(page.get_by_role("region", name="Checkpoint diff")).to_be_visible()


def checkpoint_page(page: Page, d: Data):
    page.goto(t(d, f"runs/{d.finished.id}/checkpoints/{d.diff[1]}"))
    expect(page.get_by_role("heading", level=1)).to_be_visible()


def approvals_pending(page: Page, d: Data):
    page.goto(t(d, "approvals"))
    expect(page.get_by_role("link", name="Book the Lisbon trip?").first).to_be_visible()


def approvals_decided(page: Page, d: Data):
    page.goto(t(d, "approvals?show=decided"))
    expect(page.get_by_role("link", name="Ship it?").first).to_be_visible()


def approval_with_edit_form(page: Page, d: Data):
    page.goto(t(d, f"approvals/{d.pending.id}"))
    page.get_by_text("Approve an edited artifact").click()
    expect(page.get_by_label("Artifact (JSON)")).to_be_visible()


def approval_edit_error(page: Page, d: Data):
    approval_with_edit_form(page, d)
    page.get_by_label("Artifact (JSON)").fill("{not json")
    expect(page.get_by_text("Not valid JSON").first).to_be_visible()


def approval_decided(page: Page, d: Data):
    page.goto(t(d, f"approvals/{d.decided.id}"))
    expect(page.get_by_role("heading", level=1, name="Ship it?")).to_be_visible()


def agents(page: Page, d: Data):
    page.goto(t(d, "agents"))
    expect(page.get_by_role("link", name="chatter").first).to_be_visible()


def agent(page: Page, d: Data):
    page.goto(t(d, "agents/onboarding"))
    expect(page.get_by_role("heading", level=1)).to_contain_text("onboarding")


def settings(page: Page, d: Data):
    page.goto(t(d, "settings"))
    expect(page.get_by_role("heading", level=1)).to_be_visible()


def api_keys(page: Page, d: Data):
    page.goto(t(d, "settings/api-keys"))
    expect(page.get_by_role("button", name="Create the key")).to_be_visible()


def api_key_error(page: Page, d: Data):
    page.goto(t(d, "settings/api-keys"))
    page.get_by_role("button", name="Create the key").click()
    expect(page.get_by_text("Pick at least one scope.").first).to_be_visible()


def api_key_shown_once(page: Page, d: Data):
    page.goto(t(d, "settings/api-keys"))
    page.get_by_label("Name").fill(f"a11y {uuid.uuid4().hex[:4]}")
    page.locator("input[name=scopes]").first.check()
    page.get_by_role("button", name="Create the key").click()
    expect(page.get_by_text("ap_").first).to_be_visible()


def api_key_revoke_confirm(page: Page, d: Data):
    api_key_shown_once(page, d)
    page.goto(t(d, "settings/api-keys"))
    page.get_by_role("link", name="Revoke").first.click()
    expect(page.get_by_role("button", name="Revoke the key")).to_be_visible()


def connections(page: Page, d: Data):
    page.goto(t(d, "settings/connections"))
    expect(page.get_by_role("heading", level=1)).to_be_visible()


def credentials(page: Page, d: Data):
    page.goto(t(d, "settings/credentials"))
    expect(page.get_by_role("heading", level=1)).to_be_visible()


def egress(page: Page, d: Data):
    page.goto(t(d, "settings/egress"))
    expect(page.get_by_role("heading", level=1)).to_be_visible()


def retention(page: Page, d: Data):
    page.goto(t(d, "settings/retention"))
    expect(page.get_by_role("heading", level=1)).to_be_visible()


def members(page: Page, d: Data):
    page.goto(t(d, "members"))
    expect(page.get_by_role("region", name="Open invitations")).to_be_visible()


def members_invite_error(page: Page, d: Data):
    page.goto(t(d, "members"))
    invite = page.get_by_role("region", name="Invite someone")
    invite.get_by_label("Email").fill("not an email")
    invite.get_by_role("button", name="Send the invitation").click()
    expect(page.get_by_role("region", name="Invite someone").get_by_label("Email")
           ).to_have_attribute("aria-invalid", "true")


def forbidden(page: Page, d: Data):
    page.goto(t(d, "settings"))  # as a viewer: the 403 page
    expect(page.get_by_role("heading", level=1)).to_be_visible()


def audit(page: Page, d: Data):
    page.goto(t(d, "audit"))
    expect(page.get_by_role("heading", level=1)).to_be_visible()


def account(page: Page, d: Data):
    page.goto("/account")
    expect(page.get_by_role("heading", level=1)).to_be_visible()


def two_factor_enrolment(page: Page, d: Data):
    page.goto("/2fa")
    expect(page.locator("svg").filter(has_text="QR code").first).to_be_visible()


def two_factor_wrong_code(page: Page, d: Data):
    two_factor_enrolment(page, d)
    page.get_by_label("Code", exact=False).first.fill("000000")
    page.get_by_role("button", name="Confirm and continue").click()
    expect(page.get_by_label("Code", exact=False).first).to_have_attribute("aria-invalid", "true")


def invitation(page: Page, d: Data):
    page.goto(f"/invite/{d.invite_token}")
    expect(page.get_by_role("heading", level=1)).to_be_visible()


def invitation_invalid(page: Page, d: Data):
    page.goto("/invite/not-a-token")
    expect(page.get_by_role("heading", level=1)).to_be_visible()


def password_reset(page: Page, d: Data):
    page.goto("/password-reset")
    expect(page.get_by_role("heading", level=1)).to_be_visible()


def password_reset_sent(page: Page, d: Data):
    page.goto("/password-reset/sent")
    expect(page.get_by_role("heading", level=1)).to_be_visible()


def password_reset_confirm(page: Page, d: Data):
    user = get_user_model().objects.get(id=d.newcomer.id)  # a sign-in changes the token
    page.goto(f"/password-reset/{urlsafe_base64_encode(force_bytes(user.pk))}/"
              f"{default_token_generator.make_token(user)}")
    expect(page.get_by_role("heading", level=1)).to_be_visible()
    expect(page.locator("input[type=password]").first).to_be_visible()


def password_reset_done(page: Page, d: Data):
    page.goto("/password-reset/done")
    expect(page.get_by_role("heading", level=1)).to_be_visible()


SIGNED_IN = [runs_filtered, runs_error, runs_bulk_confirm, start_form, start_form_json_error,
             run_waiting, run_asking, run_failed, run_finished_with_diff, checkpoint_page,
             approvals_pending, approvals_decided, approval_with_edit_form, approval_edit_error,
             approval_decided, agents, agent, settings, api_keys, api_key_error,
             api_key_shown_once, api_key_revoke_confirm, connections, credentials, egress,
             retention, members, members_invite_error, audit, account, forbidden,
             two_factor_enrolment, two_factor_wrong_code]
SIGNED_OUT = [invitation, invitation_invalid, password_reset, password_reset_sent,
              password_reset_confirm, password_reset_done]


# The outermost elements that reach past the viewport's right edge (what makes a page scroll).
OVERFLOWING = """() => [...document.querySelectorAll('body *')]
  .filter(e => e.getBoundingClientRect().right > innerWidth + 0.5
               && e.parentElement.getBoundingClientRect().right <= innerWidth + 0.5)
  .slice(0, 8).map(e => e.tagName.toLowerCase() + (e.id ? '#' + e.id : '')
      + (typeof e.className == 'string' && e.className ? '.' + e.className.trim().replace(/ +/g, '.') : '')
      + ` (right ${Math.round(e.getBoundingClientRect().right)})`)"""


def check(page: Page, viewport: str) -> None:
    """axe on the page with every <details> opened (the forms folded in them: fork, migrate,
    edit...: what a closed one hides is checked too, and its summary either way), and the
    width with them open. One axe pass per page keeps the suite's time."""
    page.evaluate("document.querySelectorAll('details').forEach(d => d.open = true)")
    axe_check(page)
    width = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    assert width[0] <= width[1], (f"{page.url} scrolls sideways at {viewport}: {width[0]} > "
                                  f"{width[1]}; too wide: {page.evaluate(OVERFLOWING)}")


def check_at_both_widths(page: Page) -> None:
    """The page as opened at 1280 px, then the same page at 390 px (resized, not reloaded: one
    page set up, checked twice)."""
    for viewport in ("wide", "narrow"):
        page.set_viewport_size(VIEWPORTS[viewport])
        check(page, viewport)


@pytest.mark.parametrize("open_it", SIGNED_IN, ids=lambda f: f.__name__)
def test_a_signed_in_page_passes_axe_and_fits(chromium, dashboard_server, pages_data, owner_state,
                                             open_it):
    context = chromium.new_context(base_url=dashboard_server.url, viewport=VIEWPORTS["wide"],
                                   storage_state=owner_state)
    context.set_default_timeout(15_000)
    try:
        page = context.new_page()
        if open_it in (two_factor_enrolment, two_factor_wrong_code, forbidden):
            page.context.clear_cookies()  # a viewer with no two-factor device
            sign_in(page, pages_data.newcomer)
        open_it(page, pages_data)
        check_at_both_widths(page)
    finally:
        context.close()


@pytest.mark.parametrize("open_it", SIGNED_OUT, ids=lambda f: f.__name__)
def test_a_signed_out_page_passes_axe_and_fits(open_page, pages_data, open_it):
    page = open_page("wide")
    open_it(page, pages_data)
    check_at_both_widths(page)


def test_the_nested_artifact_is_shown_readably(open_page, pages_data):
    """The approval the pages above check really is the nested one (not an empty page)."""
    page = open_page()
    sign_in(page, pages_data.owner)
    page.goto(t(pages_data, f"approvals/{pages_data.pending.id}"))
    expect(page.get_by_text("Lisbon").first).to_be_visible()
    assert json.loads(page.get_by_label("Artifact (JSON)").input_value()) == NESTED
