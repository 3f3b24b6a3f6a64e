"""A tenant agent defined in a real browser, through the form alone: an owner adds one tool with
a rule approval (amount above 500), saves, edits the rule (an error shown inline first), and
sees v2's diff; the run page of a run of it shows the conversation. axe-core checks each new
page at 1280 px, and that none scrolls sideways at 390 px."""

import re
import uuid

from django_tenants.utils import tenant_context
from playwright.sync_api import expect

from integrations.services import credential_set
from runs.definitions.selectors import definition_find
from runs.models import Run
from tests.browser.conftest import NARROW, axe_check, person, sign_in
from tests.dashboard.test_agent_definitions import PAYING_SCRIPT
from tests.support import runs as driven
from tests.support.fakes.fixtures import fake_stripe, scripted_model  # noqa: F401


def test_an_owner_defines_an_agent_with_a_rule_approval_and_sees_v2s_diff(
        open_page, browser_tenant, scripted_model, fake_stripe):  # noqa: F811
    name = f"payer-{uuid.uuid4().hex[:6]}"
    scripted_model.script({"payer-model": PAYING_SCRIPT})
    with tenant_context(browser_tenant):
        credential_set(connector="model", label="scripted",
                       secrets={"api_key": "sk-test", "base_url": scripted_model.base_url})
        credential_set(connector="payments", secrets={"secret_key": "sk_test_browser",
                                                      "api_url": fake_stripe.url})
    page = open_page("wide")
    sign_in(page, person(browser_tenant, "owner"))
    page.goto("/t/browser/agents")
    axe_check(page)
    page.get_by_role("link", name="Define an agent").click()

    page.get_by_label("Name", exact=True).fill(name)
    page.get_by_label("Model credential").select_option("scripted")
    page.get_by_label("Model name").fill("payer-model")
    page.get_by_label("Instructions").fill("Pay the invoice; ask above 500.")
    page.get_by_label("New tool").select_option(label="payments.charge (credential default)")
    page.get_by_role("button", name="Add the tool").click()
    tool = page.get_by_role("group", name="Tool 1: payments.charge (credential default)")
    expect(tool.get_by_label("Parameters (JSON Schema)")).to_have_value(
        re.compile(r'"customer"'))  # the action's default schema, to edit
    tool.get_by_label("Name", exact=True).fill("pay")
    tool.get_by_label("Approval", exact=True).select_option("rule")
    tool.get_by_label("Rule: argument").fill("amount")
    tool.get_by_label("Rule: operator").select_option("above")
    tool.get_by_label("Rule: value").fill("500")
    axe_check(page)
    page.get_by_role("button", name="Save the agent").click()
    expect(page.get_by_role("heading", level=1)).to_contain_text(name)
    expect(page.get_by_role("cell", name="when amount above 500")).to_be_visible()

    page.get_by_role("link", name="Edit (makes v2)").click()
    tool = page.get_by_role("group", name="Tool 1: payments.charge (credential default)")
    tool.get_by_label("Rule: operator").select_option("in")  # "in" takes a list: refused
    page.get_by_role("button", name="Save a new version").click()
    expect(tool.get_by_text("must be a list of values")).to_be_visible()
    axe_check(page)  # the form with its errors inline
    tool.get_by_label("Rule: operator").select_option("above")
    tool.get_by_label("Rule: value").fill("900")
    page.get_by_role("button", name="Save a new version").click()
    changes = page.get_by_role("region", name="Changes from v1 to v2")
    expect(changes).to_contain_text("tools[0].approval.above")
    expect(changes.get_by_role("row").filter(has_text="tools[0].approval.above")).to_contain_text("900")
    axe_check(page)
    page.get_by_role("link", name="v1", exact=True).click()
    expect(page.get_by_role("heading", level=1)).to_contain_text("v1")
    axe_check(page)

    with tenant_context(browser_tenant):  # run in this process: a worker would add nothing
        assert definition_find(name=name).version == 2
        run = driven.finished(driven.start(name, input={"invoice": "INV-7"}).id)
        assert run.status == Run.Status.SUCCEEDED, run.error
    page.goto(f"/t/browser/runs/{run.id}")
    conversation = page.get_by_role("region", name="Conversation")
    conversation.get_by_role("link", name="effect tool:call_0_0: done").click()
    expect(page.get_by_role("row").filter(has_text="tool:call_0_0")).to_contain_text("done")
    axe_check(page)

    page.set_viewport_size(NARROW)  # and nothing of the new pages scrolls sideways at 390 px
    for url in (f"/t/browser/runs/{run.id}", f"/t/browser/agents/{name}",
                f"/t/browser/agents/{name}/edit", "/t/browser/agents"):
        page.goto(url)
        assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth"), url
