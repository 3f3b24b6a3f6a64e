"""Tenant agents in the dashboard: defined in a plain POST form (tool rows added by a submit
button), errors shown next to their input, versions with who and when, the diff between
consecutive versions, retiring; viewers read and may not write (403), another tenant's agent
is a 404, and every change is in the tenant's audit log with who made it."""

import re
import uuid

import pytest
from django.test import Client
from django_tenants.utils import tenant_context

from integrations.selectors import credential_list
from integrations.services import credential_set
from runs.definitions.selectors import definition_find, definition_versions
from runs.definitions.services import definition_create
from runs.definitions.spec import ACTIONS
from runs.effects.models import Effect
from runs.models import Run
from tenants.models import AuditEntry
from tests.dashboard.conftest import person, signed_in
from tests.support.fakes.fixtures import fake_stripe, scripted_model  # noqa: F401
from tests.support.runs import finished, start


@pytest.fixture
def credentials(acme):
    """acme's model credential and a payments credential, for the form's choices."""
    with tenant_context(acme):
        credential_set(connector="model", secrets={"api_key": "sk-test", "base_url": "http://127.0.0.1:9/v1"})
        credential_set(connector="payments", secrets={"api_key": "pk-test", "base_url": "http://127.0.0.1:9"})


@pytest.fixture
def owner(acme):
    return person(acme, "owner")


def agent_name() -> str:
    return f"triage-{uuid.uuid4().hex[:6]}"


def form_data(name: str, **extra) -> dict:
    data = {"name": name, "description": "Pays small invoices", "model_credential": "default",
            "model_name": "gpt-4o-mini", "temperature": "0", "max_tokens": "512",
            "instructions": "You triage invoices.", "input_schema": "", "input_example": "",
            "max_turns": "5", "limit_tokens": "", "max_cost_usd": "", "max_wall_seconds": "",
            "tool_count": "1", "save": "1",
            "tool-0-source": "connector:payments.charge:default", "tool-0-name": "pay",
            "tool-0-description": "Charge the customer", "tool-0-parameters": "",
            "tool-0-approval": "rule", "tool-0-rule_argument": "amount",
            "tool-0-rule_operator": "above", "tool-0-rule_value": "500"}
    data.update(extra)
    return data


def field_error(html: str, field_id: str) -> str:
    """The error printed under the input with this id (dashboard/field.html), or ''."""
    found = re.search(rf'<p class="field-error" id="{field_id}_error">(.*?)</p>', html, flags=re.S)
    return found.group(1) if found else ""


def test_adding_a_tool_re_renders_the_form_with_a_row_prefilled(acme, credentials, owner):
    client = signed_in(owner)
    page = client.get("/t/acme/agents/_new").content.decode()
    assert 'value="connector:payments.charge:default"' in page  # payments has a credential
    with tenant_context(acme):  # (other tests may have given acme more credentials)
        held = set(credential_list().values_list("connector", flat=True))
    for action, (connector, _) in ACTIONS.items():  # actions of connectors with none are not offered
        assert (f'value="connector:{action}:' in page) == (connector in held), action
    response = client.post("/t/acme/agents/_new", {**form_data(agent_name(), tool_count="0"),
                                                   "save": "", "add_tool": "1",
                                                   "new_tool": "connector:payments.charge:default"})
    html = response.content.decode()
    assert response.status_code == 200
    assert 'name="tool_count" value="1"' in html and "Tool 1: payments.charge (credential default)" in html
    assert "&quot;customer&quot;" in html  # the action's default parameter schema, to edit
    assert "field-error" not in html  # nothing was judged yet


def test_an_owner_creates_an_agent_with_a_rule_approval(acme, credentials, owner):
    name = agent_name()
    response = signed_in(owner).post("/t/acme/agents/_new", form_data(name))
    assert response.status_code == 302 and response["Location"] == f"/t/acme/agents/{name}"
    with tenant_context(acme):
        row = definition_find(name=name)
    assert row.version == 1 and row.created_by == f"user:{owner.username}"
    tool = row.spec["tools"][0]
    assert tool["approval"] == {"argument": "amount", "above": 500} and tool["action"] == "payments.charge"
    assert row.spec["limits"] == {"max_turns": 5} and row.spec["model"]["temperature"] == 0
    entry = AuditEntry.objects.get(tenant=acme, action="agent.created", target=f"agent:{name}")
    assert entry.actor == f"user:{owner.username}" and entry.detail["version"] == 1
    assert f"agent:{name}" in signed_in(owner).get("/t/acme/audit").content.decode()


def test_an_edit_with_an_error_shows_it_next_to_the_tools_approval(acme, credentials, owner):
    name = agent_name()
    client = signed_in(owner)
    assert client.post("/t/acme/agents/_new", form_data(name)).status_code == 302
    edit = client.get(f"/t/acme/agents/{name}/edit").content.decode()
    assert 'name="tool-0-rule_value"' in edit and 'value="500"' in edit  # the stored rule, to edit
    # "in" takes a list: the service's "tools[0].approval.in" lands on that row's value
    response = client.post(f"/t/acme/agents/{name}/edit", form_data(
        name, **{"tool-0-rule_operator": "in", "instructions": "Changed."}))
    html = response.content.decode()
    assert response.status_code == 400
    assert "must be a list of values" in field_error(html, "id_tool-0-rule_value")
    assert "Changed.</textarea>" in html  # what was typed stays
    # a JSON mistake is the form's own, shown at the input schema
    response = client.post(f"/t/acme/agents/{name}/edit", form_data(name, input_schema='{"type": '))
    assert "Not valid JSON" in field_error(response.content.decode(), "id_input_schema")
    # a schema the spec refuses: the service's input_schema error at the same place
    response = client.post(f"/t/acme/agents/{name}/edit", form_data(name, input_schema='{"type": 5}'))
    assert "not a valid JSON Schema" in field_error(response.content.decode(), "id_input_schema")
    with tenant_context(acme):
        assert definition_versions(name=name).count() == 1  # nothing was saved


SECOND_TOOL = {"tool_count": "2", "tool-1-source": "connector:payments.charge:default",
               "tool-1-name": "pay", "tool-1-approval": "never"}
WAIT_TOOL = {"tool-0-source": "wait_for_event", "tool-0-name": "wait_paid", "tool-0-approval": "never",
             "tool-0-event": "invoice.paid", "tool-0-key_argument": "", "tool-0-rule_argument": ""}
# Mistakes people make in the form: (what they typed, the input whose error says so, a phrase of it)
MISTAKES = {
    "a name with capitals": ({"name": "Invoice Triage"}, "id_name", "lowercase letters"),
    "a platform agent's name": ({"name": "research"}, "id_name", "one of the platform"),
    "no model name": ({"model_name": ""}, "id_model_name", "required"),
    "a temperature in words": ({"temperature": "warm"}, "id_temperature", "Enter a number"),
    "an input schema that is not JSON": ({"input_schema": '{"type": "object",}'}, "id_input_schema",
                                         "Not valid JSON"),
    "an example that breaks the schema": ({"input_schema": '{"type": "object", "required": ["invoice"]}',
                                           "input_example": '{"invoce": 1}'}, "id_input_example",
                                          "&#x27;invoice&#x27; is a required property"),
    "two tools with one name": ({**SECOND_TOOL}, "id_tool-1-name", "already the name of tools[0]"),
    "a rule on a misspelt argument": ({"tool-0-rule_argument": "amout"}, "id_tool-0-rule_argument",
                                      "did you mean &#x27;amount&#x27;?"),
    "parameters that are a list": ({"tool-0-parameters": "[1, 2]"}, "id_tool-0-parameters", "JSON object"),
    "a wait without its key argument": ({**WAIT_TOOL}, "id_tool-0-key_argument", "is required"),
    "too many turns": ({"max_turns": "5000"}, "id_max_turns", "at most 1000"),
    "a cost of zero": ({"max_cost_usd": "0"}, "id_max_cost_usd", "positive"),
}


@pytest.mark.parametrize("mistake", sorted(MISTAKES))
def test_each_mistake_is_shown_at_its_input_and_what_was_typed_stays(acme, credentials, owner, mistake):
    typed, field_id, says = MISTAKES[mistake]
    data = {**form_data(agent_name(), instructions="Pay what is due; keep the receipt."), **typed}
    response = signed_in(owner).post("/t/acme/agents/_new", data)
    html = response.content.decode()
    assert response.status_code == 400
    assert says in field_error(html, field_id), (mistake, re.findall(r'field-error"[^>]*>(.*?)</p>', html))
    assert "The definition was not saved" in html
    assert "Pay what is due; keep the receipt.</textarea>" in html  # nothing typed is lost
    for key, value in typed.items():
        if value and not key.endswith("source") and key != "tool_count":
            assert value.replace('"', "&quot;") in html, key
    with tenant_context(acme):
        assert not definition_versions(name=data["name"]).exists()


def test_versions_are_listed_with_who_and_when_and_the_diff_of_each(acme, credentials, owner):
    name = agent_name()
    client = signed_in(owner)
    client.post("/t/acme/agents/_new", form_data(name))
    response = client.post(f"/t/acme/agents/{name}/edit", form_data(name, **{"tool-0-rule_value": "900"}))
    assert response.status_code == 302
    again = client.post(f"/t/acme/agents/{name}/edit", form_data(name, **{"tool-0-rule_value": "900"}))
    assert again.status_code == 302  # the same definition: no third version
    with tenant_context(acme):
        assert [v.version for v in definition_versions(name=name)] == [2, 1]
    assert AuditEntry.objects.filter(tenant=acme, action="agent.updated", target=f"agent:{name}").count() == 1

    viewer = signed_in(person(acme, "viewer"))
    page = viewer.get(f"/t/acme/agents/{name}").content.decode()
    assert "v2" in page and f"user:{owner.username}" in page
    assert "tools[0].approval.above" in page  # v2's change from v1, by path
    assert "<code>500</code>" in page and "<code>900</code>" in page
    assert "when amount above 900" in page  # the definition, readable
    assert "temperature 0;" in page and "at most 512 tokens a turn" in page
    v1 = viewer.get(f"/t/acme/agents/{name}/versions/1").content.decode()
    assert "when amount above 500" in v1 and "nothing to compare with" in v1
    assert viewer.get(f"/t/acme/agents/{name}/versions/7").status_code == 404
    listing = viewer.get("/t/acme/agents").content.decode()
    assert f'href="/t/acme/agents/{name}"' in listing and "Define an agent" not in listing


def test_retiring_asks_first_then_stops_new_runs_and_is_audited(acme, credentials, owner):
    name = agent_name()
    client = signed_in(owner)
    client.post("/t/acme/agents/_new", form_data(name))
    confirm = client.get(f"/t/acme/agents/{name}/retire")
    assert confirm.status_code == 200 and b"Retire the agent" in confirm.content
    with tenant_context(acme):
        assert definition_find(name=name) is not None  # a GET changes nothing
    assert client.post(f"/t/acme/agents/{name}/retire").status_code == 302
    with tenant_context(acme):
        assert definition_find(name=name) is None  # no version starts new runs
    assert b"retired" in client.get(f"/t/acme/agents/{name}").content
    entry = AuditEntry.objects.get(tenant=acme, action="agent.retired", target=f"agent:{name}")
    assert entry.actor == f"user:{owner.username}"
    start = client.get("/t/acme/runs/start").content.decode()
    assert f'value="{name}"' not in start  # the start form offers it no more


def test_the_start_form_offers_a_tenant_agent_and_checks_its_input_schema(acme, credentials, owner):
    name = agent_name()
    schema = '{"type": "object", "required": ["invoice"]}'
    signed_in(owner).post("/t/acme/agents/_new", form_data(name, input_schema=schema))
    client = signed_in(owner)
    page = client.get(f"/t/acme/agents/{name}").content.decode()
    assert f"/t/acme/runs/start?agent={name}" in page
    start = client.get(f"/t/acme/runs/start?agent={name}").content.decode()
    assert f'<option value="{name}" selected' in start
    response = client.post("/t/acme/runs/start", {"agent": name, "version": "", "durability": "sync",
                                                  "input": "{}", "idempotency_key": str(uuid.uuid4())})
    assert response.status_code == 200 and b"&#x27;invoice&#x27; is a required property" in response.content


@pytest.mark.parametrize("role", ["viewer", "operator", "approver"])
def test_roles_without_agents_define_get_403_on_every_write(acme, credentials, owner, role):
    name = agent_name()
    signed_in(owner).post("/t/acme/agents/_new", form_data(name))
    client = signed_in(person(acme, role))
    assert client.get(f"/t/acme/agents/{name}").status_code == 200  # reading is for everyone
    for url in ("/t/acme/agents/_new", f"/t/acme/agents/{name}/edit", f"/t/acme/agents/{name}/retire"):
        assert client.get(url).status_code == 403, url
        assert client.post(url, form_data(name)).status_code == 403, url
    with tenant_context(acme):
        row = definition_find(name=name)
    assert row.version == 1 and row.retired_at is None


def test_an_admin_may_define(acme, credentials):
    response = signed_in(person(acme, "admin")).post("/t/acme/agents/_new", form_data(agent_name()))
    assert response.status_code == 302


def test_another_tenants_agent_is_a_404(acme, globex, credentials):
    name = agent_name()
    with tenant_context(globex):
        credential_set(connector="model", secrets={"api_key": "sk-g", "base_url": "http://127.0.0.1:9/v1"})
        definition_create(name=name, spec={"model": {"name": "m"}, "instructions": "x"}, by="test")
    client = signed_in(person(acme, "owner"))
    for url in (f"/t/acme/agents/{name}", f"/t/acme/agents/{name}/edit",
                f"/t/acme/agents/{name}/retire", f"/t/acme/agents/{name}/versions/1"):
        assert client.get(url).status_code == 404, url
    assert client.post(f"/t/acme/agents/{name}/retire").status_code == 404
    assert client.get(f"/t/globex/agents/{name}").status_code == 404  # not a member of globex
    with tenant_context(globex):
        assert definition_find(name=name).retired_at is None


def test_csrf_is_required_on_the_form(acme, credentials, owner):
    client = Client(enforce_csrf_checks=True)
    client.force_login(owner)
    assert client.post("/t/acme/agents/_new", form_data(agent_name())).status_code == 403


LONG_ANSWER = "Paid. " + "All details follow. " * 100  # cut on the page, whole a link away
# The model pays (one tool call), then answers at length.
PAYING_SCRIPT = [{"tool_calls": [{"name": "pay", "arguments": {
    "amount": 42, "currency": "EUR", "customer": "cus_1"}}]}, {"content": LONG_ANSWER}]


def test_the_run_page_shows_the_conversation_with_each_call_linked_to_its_effect(
        acme, globex, owner, scripted_model, fake_stripe):  # noqa: F811
    name = agent_name()
    scripted_model.script({"gpt-4o-mini": PAYING_SCRIPT})  # form_data's model name
    with tenant_context(acme):
        credential_set(connector="model", secrets={"api_key": "sk-test", "base_url": scripted_model.base_url})
        credential_set(connector="payments", secrets={"secret_key": "sk_test_acme",
                                                      "api_url": fake_stripe.url})
    client = signed_in(owner)
    assert client.post("/t/acme/agents/_new", form_data(name)).status_code == 302
    with tenant_context(acme):
        run = finished(start(name, input={"invoice": "INV-1"}).id)
        assert run.status == Run.Status.SUCCEEDED, run.error
        pay = Effect.objects.get(run=run, name="tool:call_0_0")
        turn = Effect.objects.get(run=run, name="turn", scope="0")  # the first turn
    html = client.get(f"/t/acme/runs/{run.id}").content.decode()
    assert 'aria-labelledby="conversation-title"' in html
    assert f'href="#effect-{pay.id}">effect tool:call_0_0: done' in html
    assert f'id="effect-{pay.id}"' in html  # the effects table row it points at
    assert f'href="#effect-{turn.id}">model turn: done' in html
    assert 'href="#message-2">result (message 2)' in html  # input 0, call 1, result 2, answer 3
    assert 'href="#message-1">the call (message 1)' in html
    assert "&quot;invoice&quot;: &quot;INV-1&quot;" in html  # the input, the first message
    full = f"/t/acme/runs/{run.id}/messages/3"
    assert f'href="{full}">Message 3 in full' in html  # long: cut, the whole text a link away
    panel = html.split('id="conversation"', 1)[1].split("</section>", 1)[0]
    assert 0 < panel.count("All details follow.") < 100
    whole = client.get(full).content.decode()
    assert whole.count("All details follow.") == 100
    assert client.get(f"/t/acme/runs/{run.id}/messages/4").status_code == 404
    other = signed_in(person(globex, "owner"))  # the run is not in globex's schema
    assert other.get(f"/t/globex/runs/{run.id}/messages/3").status_code == 404


def test_deleting_a_credential_asks_first_naming_the_agents_it_would_break(acme, credentials, owner):
    name, label = agent_name(), f"l{uuid.uuid4().hex[:8]}"
    with tenant_context(acme):
        credential_set(connector="payments", label=label, secrets={"secret_key": "sk_test_x"})
        definition_create(name=name, by="test", spec={
            "model": {"name": "m"}, "instructions": "Pay.",
            "tools": [{"name": "pay", "kind": "connector", "action": "payments.charge",
                       "credential": label}]})
    page = signed_in(owner).get(f"/t/acme/settings/credentials/payments/{label}/delete").content.decode()
    assert f"This tenant&#x27;s agents name it: {name} v1; their calls of it are not made" in page
    model = signed_in(owner).get("/t/acme/settings/credentials/model/default/delete").content.decode()
    assert f"{name} v1" in model and "their runs fail at the next model turn" in model


def test_a_name_no_agent_can_have_is_a_404_on_every_page(acme, credentials, owner):
    client = signed_in(owner)
    for name in ("a%00b", "UPPER", "x" * 80):
        for url in (f"/t/acme/agents/{name}", f"/t/acme/agents/{name}/edit",
                    f"/t/acme/agents/{name}/retire", f"/t/acme/agents/{name}/versions/1"):
            assert client.get(url).status_code == 404, url
