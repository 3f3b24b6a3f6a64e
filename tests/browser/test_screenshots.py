"""Screenshots of the dashboard's main pages at 1280x800 and 390x844 (viewport-sized, not full
page, so the PNGs stay small) for docs/dashboard.md.

    DASHBOARD_SCREENSHOTS=1 make test ARGS="tests/browser/test_screenshots.py"

writes them into docs/dashboard/ (commit them); without the variable they go to
.dev/test-logs/screenshots/, so an ordinary test run never changes committed files."""

import os
import uuid
from pathlib import Path

from django.urls import NoReverseMatch, reverse
from django_tenants.utils import tenant_context
from playwright.sync_api import expect

from runs.approvals.models import Approval
from runs.approvals.services import event_deliver
from runs.models import Run
from runs.services import run_start
from tests.browser.conftest import person, sign_in
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parent.parent.parent
DOCS = ROOT / "docs" / "dashboard"
SCRATCH = ROOT / ".dev" / "test-logs" / "screenshots"
# Pages of areas that other branches add: shot once their URL exists (reverse() finds it).
LATER = {"approvals": "dashboard:approvals", "agents": "dashboard:agents",
         "settings": "dashboard:settings", "members": "dashboard:members"}


def target() -> Path:
    folder = DOCS if os.environ.get("DASHBOARD_SCREENSHOTS") else SCRATCH
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def test_screenshots_of_the_main_pages(open_page, browser_tenant, acme, worker):
    tenant = browser_tenant.schema_name
    with tenant_context(browser_tenant):
        done = run_start(agent="chatter", input={"steps": 3}).run
        parked = run_start(agent="onboarding", input={
            "employee": {"name": "Ada Lovelace", "email": f"ada-{uuid.uuid4().hex[:6]}@{tenant}.test"},
            "it_email": f"it@{tenant}.test", "start_date": "next Monday"}).run
        grace = f"grace-{uuid.uuid4().hex[:6]}@{tenant}.test"  # signed: asks for its schedule
        asking = run_start(agent="onboarding", input={
            "employee": {"name": "Grace Hopper", "email": grace},
            "it_email": f"it@{tenant}.test", "start_date": "next Monday"}).run
        wait_for(lambda: Run.objects.get(id=done.id).status == Run.Status.SUCCEEDED
                 and Run.objects.get(id=parked.id).status == Run.Status.WAITING
                 and Run.objects.get(id=asking.id).status == Run.Status.WAITING,
                 timeout=60, what="a finished and two waiting runs")
        event_deliver(kind="docs.signed", key=grace, payload={"signed": True})
        wait_for(lambda: Approval.objects.filter(run_id=asking.id, status="pending").exists(),
                 timeout=60, what="the second run to ask for its day-one schedule's approval")
        approval = Approval.objects.get(run_id=asking.id, status="pending")
    owner = person(browser_tenant, "owner", email="owner@browser.test")  # the same in every shot
    person(acme, "viewer", email=owner.get_username())  # two tenants: the picker, the switcher
    folder, shot = target(), []
    for viewport in ("wide", "narrow"):
        page = open_page(viewport)
        page.goto("/login")
        expect(page.get_by_role("button", name="Sign in")).to_be_visible()
        shot.append(page.screenshot(path=folder / f"login-{viewport}.png"))
        sign_in(page, owner)
        expect(page.get_by_role("heading", level=1, name="Your tenants")).to_be_visible()
        shot.append(page.screenshot(path=folder / f"tenants-{viewport}.png"))
        page.goto(f"/t/{tenant}/runs")
        expect(page.get_by_role("row").filter(has_text=str(parked.id)[:8])).to_contain_text("waiting")
        shot.append(page.screenshot(path=folder / f"runs-{viewport}.png"))
        page.goto(f"/t/{tenant}/runs/{parked.id}")
        if page.get_by_role("heading", level=1, name="Not found").count() == 0:  # the run page
            shot.append(page.screenshot(path=folder / f"run-{viewport}.png"))
        for name, url_name in LATER.items():
            try:
                url = reverse(url_name, args=[tenant])
            except NoReverseMatch:
                continue
            page.goto(url)
            shot.append(page.screenshot(path=folder / f"{name}-{viewport}.png"))
        page.goto(f"/t/{tenant}/approvals/{approval.id}")
        expect(page.get_by_role("heading", level=1, name="Day-one schedule for Grace Hopper")
               ).to_be_visible()
        shot.append(page.screenshot(path=folder / f"approval-{viewport}.png"))
    assert len(shot) >= 6
    for picture in shot:  # PNG, and small enough to commit
        assert picture[:8] == b"\x89PNG\r\n\x1a\n" and len(picture) < 400_000
