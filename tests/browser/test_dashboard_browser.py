"""The dashboard in a real browser, on the pages every branch has: signing in through the form,
the tenant picker, the runs list with a run a real worker finishes, another tenant's pages as the
404 page, and axe-core on each page at 1280 and 390 pixels wide."""

import re
import uuid

import pytest
from django_tenants.utils import tenant_context
from playwright.sync_api import expect

from runs.approvals.services import event_deliver
from runs.models import Run
from runs.services import run_start
from tests.browser.conftest import PASSWORD, axe_check, person, sign_in
from tests.support.waiting import wait_for


def waiting_run(tenant) -> tuple[Run, str]:
    """A run of the test agent `waiter` that a worker parks on an event (kind, key returned)."""
    key = f"browser-{uuid.uuid4().hex[:8]}"
    with tenant_context(tenant):
        run = run_start(agent="waiter", input={"how": "event", "kind": "browser.go", "key": key}).run
        wait_for(lambda: Run.objects.get(id=run.id).status == Run.Status.WAITING, timeout=30,
                 what="the worker to park the run on its event")
    return run, key


def release(tenant, key: str) -> None:
    with tenant_context(tenant):
        event_deliver(kind="browser.go", key=key, payload={"go": True})


def run_row(page, run: Run):
    """The runs list's row of `run` (its id's first characters are shown in every layout)."""
    return page.get_by_role("row").filter(has_text=str(run.id)[:8])


def test_signing_in_through_the_form_opens_the_tenants_runs(open_page, browser_tenant):
    owner = person(browser_tenant, "owner")
    page = open_page()
    page.goto("/")
    expect(page).to_have_url(re.compile(r"/login\?next=/$"))  # signed out: the form first
    sign_in(page, owner)
    expect(page).to_have_url(re.compile(r"/t/browser/runs$"))
    expect(page.get_by_role("heading", level=1, name="Runs")).to_be_visible()
    expect(page.get_by_role("navigation", name="Sections").get_by_role("link", name="Runs")
           ).to_have_attribute("aria-current", "page")


def test_a_wrong_password_is_refused_on_the_form_and_keeps_the_email(open_page, browser_tenant):
    owner = person(browser_tenant, "owner")
    page = open_page()
    page.goto("/login")
    page.get_by_label("Email").fill(owner.get_username())
    page.get_by_label("Password").fill(PASSWORD + " (not)")
    page.get_by_role("button", name="Sign in").click()
    expect(page).to_have_url(re.compile(r"/login$"))
    expect(page.get_by_role("alert")).to_contain_text("enter a correct")
    expect(page.get_by_label("Email")).to_have_value(owner.get_username())
    expect(page.get_by_role("button", name="Sign out")).to_have_count(0)


def test_a_person_of_two_tenants_picks_one_and_switches(open_page, acme, globex):
    both = person(acme, "viewer")
    person(globex, "operator", email=both.get_username())
    page = open_page()
    sign_in(page, both)
    expect(page.get_by_role("heading", level=1, name="Your tenants")).to_be_visible()
    page.get_by_role("link", name="globex").click()
    expect(page).to_have_url(re.compile(r"/t/globex/runs$"))
    page.wait_for_load_state("load")  # the URL changes before dashboard.js (deferred) listens
    page.get_by_label("Tenant").select_option("acme")  # dashboard.js submits the switcher
    expect(page).to_have_url(re.compile(r"/t/acme/runs$"))


def test_a_user_of_acme_gets_the_404_page_for_globex_and_its_run(open_page, acme, globex, worker):
    with tenant_context(globex):
        globex_run = run_start(agent="chatter", input={"steps": 1, "note": "private"}).run
    page = open_page()
    sign_in(page, person(acme, "owner"))
    for path in ("/t/globex/runs", f"/t/acme/runs/{globex_run.id}", f"/t/globex/runs/{globex_run.id}"):
        response = page.goto(path)
        assert response.status == 404, path
        expect(page.get_by_role("heading", level=1, name="Not found")).to_be_visible()
        expect(page.get_by_text("private")).to_have_count(0)


def test_the_runs_list_shows_a_run_that_a_real_worker_finished(open_page, browser_tenant, worker):
    run, key = waiting_run(browser_tenant)
    page = open_page()
    sign_in(page, person(browser_tenant, "viewer"))
    page.goto("/t/browser/runs")
    expect(run_row(page, run)).to_contain_text("waiting")
    release(browser_tenant, key)
    with tenant_context(browser_tenant):
        wait_for(lambda: Run.objects.get(id=run.id).status == Run.Status.SUCCEEDED, timeout=30,
                 what="the worker to finish the run")
    page.reload()
    expect(run_row(page, run)).to_contain_text("succeeded")


def test_live_status_the_runs_list_badge_turns_succeeded_without_reloading(
        open_page, browser_tenant, worker):
    """Waits for the runs list's live status (htmx polling, on the runs-list branch): the page is
    never reloaded here, so this passes only once the list updates itself."""
    run, key = waiting_run(browser_tenant)
    page = open_page()
    sign_in(page, person(browser_tenant, "viewer"))
    page.goto("/t/browser/runs")
    expect(run_row(page, run)).to_contain_text("waiting")
    navigations = []
    page.on("framenavigated", lambda frame: navigations.append(frame.url))
    release(browser_tenant, key)
    expect(run_row(page, run)).to_contain_text("succeeded", timeout=30_000)
    assert navigations == [], f"the page was reloaded: {navigations}"


# -- accessibility at both widths -------------------------------------------------------------

@pytest.mark.parametrize("viewport", ["wide", "narrow"])
def test_axe_finds_nothing_serious_on_the_login_page(open_page, dashboard_server, viewport):
    page = open_page(viewport)
    page.goto("/login")
    expect(page.get_by_role("button", name="Sign in")).to_be_visible()
    axe_check(page)
    page.get_by_role("button", name="Sign in").click()  # the form with its errors shown
    expect(page.get_by_label("Email")).to_be_visible()
    axe_check(page)


@pytest.mark.parametrize("viewport", ["wide", "narrow"])
def test_axe_finds_nothing_serious_on_the_tenant_picker(open_page, acme, globex, viewport):
    both = person(acme, "owner")
    person(globex, "approver", email=both.get_username())
    page = open_page(viewport)
    sign_in(page, both)
    expect(page.get_by_role("heading", level=1, name="Your tenants")).to_be_visible()
    axe_check(page)


@pytest.mark.parametrize("viewport", ["wide", "narrow"])
def test_axe_finds_nothing_serious_on_the_runs_list(open_page, browser_tenant, worker, viewport):
    waiting_run(browser_tenant)
    page = open_page(viewport)
    sign_in(page, person(browser_tenant, "operator"))
    page.goto("/t/browser/runs")
    expect(page.get_by_role("table")).to_be_visible()
    axe_check(page)


@pytest.mark.parametrize("viewport", ["wide", "narrow"])
def test_axe_finds_nothing_serious_on_the_404_page(open_page, acme, viewport):
    page = open_page(viewport)
    sign_in(page, person(acme, "viewer"))
    page.goto("/t/globex/runs")
    expect(page.get_by_role("heading", level=1, name="Not found")).to_be_visible()
    axe_check(page)


def test_the_runs_list_fits_390_pixels_without_sideways_scrolling(open_page, browser_tenant, worker):
    waiting_run(browser_tenant)
    page = open_page("narrow")
    sign_in(page, person(browser_tenant, "viewer"))
    page.goto("/t/browser/runs")
    expect(page.get_by_role("table")).to_be_visible()
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
