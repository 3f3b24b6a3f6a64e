"""Browser tests: Playwright (sync API) driving Debian's Chromium (/usr/bin/chromium, installed
by deploy/dev when missing; no browser is ever downloaded) against a live server process with
real Celery workers and a real SMTP server.

Fixtures: `dashboard_server` (runserver on a free port; its EMAIL_HOST/EMAIL_PORT are the session's
`smtp` server, so invitations and password resets arrive there), `browser_tenant` (a tenant of
the browser tests' own, whose run emails also go to `smtp`), `open_page(viewport)` (a fresh
browser context at `WIDE` 1280x800 or `NARROW` 390x844, its base URL the live server). Helpers:
`person()`, `sign_in(page, user)`, `axe_check(page)`.

Waiting is Playwright's `expect(...)` (it retries until its timeout), never a sleep.
"""

import os
import uuid

import pytest
from axe_playwright_python.sync_playwright import Axe
from django.db import connection
from django_tenants.utils import tenant_context
from playwright.sync_api import Page, expect, sync_playwright

from integrations.services import credential_set
from tenants.people import member_add
from tenants.services import tenant_create, tenant_delete
from tests.support.fakes.smtp import SMTPServer
from tests.support.live_server import LiveServer

CHROMIUM = "/usr/bin/chromium"
WIDE = {"width": 1280, "height": 800}
NARROW = {"width": 390, "height": 844}
VIEWPORTS = {"wide": WIDE, "narrow": NARROW}
# Shares no letters with hex or the roles, so UserAttributeSimilarityValidator never
# finds it close to a random address like operator-1acfe9bc@browser.test (about 1 in 120 did).
PASSWORD = "Zq!Jy-Kx_Vm#Vz-Hq"
# Serious enough to fail a page (axe's impacts: minor, moderate, serious, critical).
FAILING_IMPACTS = ("serious", "critical")

expect.set_options(timeout=15_000)


@pytest.fixture(scope="session")
def smtp():
    server = SMTPServer().start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def dashboard_server(django_db_setup, smtp):
    server = LiveServer(name="browser-server", env={
        "EMAIL_HOST": smtp.host, "EMAIL_PORT": str(smtp.port)}).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def browser_tenant(django_db_setup, django_db_blocker, s3, smtp):
    """A tenant of the browser tests' own (dropped afterwards, with its S3 prefix); the emails
    its runs send go to `smtp`, whichever environment the session's workers were started with."""
    with django_db_blocker.unblock():
        tenant = tenant_create(schema_name="browser").tenant
        with tenant_context(tenant):
            credential_set(connector="email", secrets={"host": smtp.host, "port": smtp.port})
        connection.set_schema_to_public()
    yield tenant
    with django_db_blocker.unblock():
        tenant_delete(tenant=tenant)
        connection.set_schema_to_public()


@pytest.fixture(scope="package")
def chromium():
    """One headless Chromium for the browser tests. While Playwright's sync API runs, an event
    loop runs in this thread and Django would refuse the tests' ORM calls ("async context");
    the tests are plain sequential code, so that check is off for them, and only them."""
    before = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
            yield browser
            browser.close()
    finally:
        if before is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = before


@pytest.fixture
def open_page(chromium, dashboard_server):
    """`open_page("narrow")` -> a Page in a fresh context (no cookies) at that viewport."""
    contexts = []

    def open_(viewport: str = "wide") -> Page:
        context = chromium.new_context(base_url=dashboard_server.url, viewport=VIEWPORTS[viewport])
        context.set_default_timeout(15_000)  # a missing button fails in seconds, not 30
        contexts.append(context)
        return context.new_page()

    yield open_
    for context in contexts:
        context.close()


def person(tenant, role: str, *, email: str | None = None, password: str = PASSWORD):
    """A new account with `role` in `tenant` (a fresh email each time: tests share the database)."""
    email = email or f"{role}-{uuid.uuid4().hex[:8]}@{tenant.schema_name}.test"
    return member_add(tenant=tenant, email=email, role=role, by="test", password=password).user


def sign_in(page: Page, user, password: str = PASSWORD) -> None:
    """Through the login form, as a person would (`user`: an account or an email); waits until
    the page shows the person signed in."""
    page.goto("/login")
    page.get_by_label("Email").fill(user if isinstance(user, str) else user.get_username())
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("button", name="Sign out")).to_be_visible()


def axe_violations(page: Page) -> list[dict]:
    """axe-core's violations on the page as it is now with impact serious or critical."""
    results = Axe().run(page)
    return [v for v in results.response["violations"] if v["impact"] in FAILING_IMPACTS]


def axe_check(page: Page) -> None:
    """Fail, listing each rule, its impact and the elements, on any serious or critical
    violation axe-core finds on the page."""
    found = axe_violations(page)
    lines = [f"{page.url}: {len(found)} serious/critical accessibility violation(s)"]
    for violation in found:
        lines.append(f"- {violation['id']} ({violation['impact']}): {violation['help']} "
                     f"[{violation['helpUrl']}]")
        lines += [f"    {' '.join(map(str, node['target']))}: {node.get('failureSummary', '').strip()}"
                  .replace("\n", " ") for node in violation["nodes"][:5]]
    assert not found, "\n".join(lines)
