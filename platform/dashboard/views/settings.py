"""The tenant's settings pages: API keys (owners), Slack and Gmail connections, connector
credentials and the sandbox egress allow-list (owners and admins), and the retention policy.
Members and invitations live in views/members.py.

Each action calls the service the REST API calls and writes a tenant audit entry naming who
did it (`request.member.actor`). Secrets go in and never come back out: an API key's plaintext
is shown once, on the page that answers its creation; a credential's JSON is re-shown only to
the person who typed it, on the page that reports its error, and never cached."""

import ipaddress
import json
from datetime import timedelta
from urllib.parse import urlsplit

from django import forms
from django.conf import settings
from django.contrib import messages
from django.db import transaction
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import path, reverse
from django.views.decorators.http import require_http_methods, require_POST

from agentplatform.addresses import address_refusal
from agentplatform.errors import ServiceError
from agentplatform.storable import json_shape
from integrations.connectors import connector_get
from integrations.connectors.base import BUILTIN
from integrations.selectors import credential_find, credential_list
from integrations.services import credential_delete, credential_set
from integrations.webhooks import services as webhooks
from integrations.webhooks.models import GmailConnection, SlackConnection
from integrations.webhooks.selectors import gmail_connection_list, slack_connection_list
from runs.agents import registry
from runs.definitions.selectors import definitions_naming
from runs.retention.selectors import (
    default_policy,
    runs_with_own_policy,
    tenant_policy,
    tenant_retention,
)
from runs.retention.services import tenant_retention_clear, tenant_retention_set
from sandboxes.egress import EgressRuleInvalid, egress_rule_parse
from sandboxes.selectors import egress_rules
from sandboxes.services import egress_allow, egress_clear, egress_remove
from tenants.models import Scope
from tenants.people import audit_record
from tenants.roles import INTEGRATIONS_MANAGE, READ, SETTINGS_MANAGE
from tenants.selectors import api_key_list, api_key_of
from tenants.services import api_key_create, api_key_revoke, scopes_check

from ..access import tenant_page

# the kind in a connection's URL: its model and the API's selector of the tenant's ones
CONNECTION_KINDS = {"slack": (SlackConnection, slack_connection_list),
                    "gmail": (GmailConnection, gmail_connection_list)}


def _page(request, template: str, context: dict, *, status: int = 200):
    return render(request, f"dashboard/settings/{template}",
                  {"section": "settings", **context}, status=status)


def _back(request, name: str, *args):
    return redirect(reverse(f"dashboard:{name}", args=[request.member.tenant.schema_name, *args]))


def _audit(request, action: str, target: str = "", **detail) -> None:
    audit_record(tenant=request.member.tenant, actor=request.member.actor, action=action,
                 target=target, **detail)


# -- the index ---------------------------------------------------------------------------------

@tenant_page(READ)
def settings_index(request, tenant):
    return _page(request, "index.html", {})


# -- API keys ------------------------------------------------------------------------------------

class ApiKeyForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="Who or what uses it, e.g. “billing job”.")
    scopes = forms.MultipleChoiceField(choices=[(scope, scope) for scope in Scope.values],
                                       widget=forms.CheckboxSelectMultiple,
                                       error_messages={"required": "Pick at least one scope."})

    def clean_scopes(self):
        try:
            return scopes_check(self.cleaned_data["scopes"])
        except ServiceError as exc:
            raise forms.ValidationError(exc.message) from None


@tenant_page(SETTINGS_MANAGE)
@require_http_methods(["GET", "POST"])
@transaction.atomic  # the change and its audit entry commit together, or neither
def api_keys(request, tenant):
    form = ApiKeyForm(request.POST if request.method == "POST" else None)
    if request.method == "POST" and form.is_valid():
        key, plaintext = api_key_create(tenant=request.member.tenant, name=form.cleaned_data["name"],
                                        scopes=form.cleaned_data["scopes"])
        _audit(request, "api_key.created", f"ap_{key.prefix}", name=key.name, scopes=key.scopes)
        # The plaintext is in this response only (never stored, never redirected through the
        # session), and the response must not be kept by a browser or a proxy.
        response = _page(request, "api_key_created.html", {"key": key, "plaintext": plaintext})
        response["Cache-Control"] = "no-store"
        return response
    return _page(request, "api_keys.html", {"form": form, "keys": api_key_list(tenant=request.member.tenant)},
                 status=400 if form.errors else 200)


@tenant_page(SETTINGS_MANAGE)
@require_http_methods(["GET", "POST"])
@transaction.atomic  # the change and its audit entry commit together, or neither
def api_key_revoke_page(request, tenant, key_id: int):
    key = api_key_of(tenant=request.member.tenant, key_id=key_id)
    if key is None:
        raise Http404("No such API key.")
    if request.method == "POST" and key.revoked_at is None:
        api_key_revoke(key=key)
        _audit(request, "api_key.revoked", f"ap_{key.prefix}", name=key.name)
        messages.success(request, f"Key ap_{key.prefix}_… ({key.name}) is revoked: it no longer works.")
        return _back(request, "settings-api-keys")
    if request.method == "POST":
        messages.info(request, f"Key ap_{key.prefix}_… was already revoked.")
        return _back(request, "settings-api-keys")
    return _page(request, "confirm.html", {
        "heading": f"Revoke API key ap_{key.prefix}_…?",
        "explanation": f"“{key.name}” stops working at once, for every program that uses it. "
                       "This cannot be undone: a new key would have to be made and handed out.",
        "action": "Revoke the key", "back": reverse("dashboard:settings-api-keys", args=[tenant])})


# -- Slack and Gmail connections -------------------------------------------------------------------

class SlackConnectionForm(forms.Form):
    # the limits of the API's serializer (the model's fields)
    team_id = forms.CharField(label="Slack team ID", max_length=32, help_text="e.g. T0123ABCD")
    signing_secret = forms.CharField(
        max_length=200, widget=forms.PasswordInput(render_value=False),
        help_text="From the Slack app's Basic Information page; stored sealed, never shown again.")
    approvals_channel = forms.CharField(label="Approvals channel ID", max_length=32, required=False,
                                        help_text="Optional: where approval requests are posted.")


class GmailConnectionForm(forms.Form):
    email = forms.EmailField(label="Mailbox", help_text="The watched address (Pub/Sub's emailAddress).")
    audience = forms.CharField(max_length=500,
                               help_text="The push subscription's OIDC audience.")
    service_account_email = forms.EmailField(
        label="Service account", help_text="The push subscription's OIDC service account email.")


def _webhook_url(request, name: str, connection_id) -> str:
    """Absolute, to paste into Slack or Google: DASHBOARD_URL's origin when set (behind a proxy
    the request's host may be an internal one), else the host this page was asked for."""
    where = reverse(name, args=[connection_id])  # the webhooks hang off the site's root
    dashboard = urlsplit(settings.DASHBOARD_URL)
    if dashboard.scheme and dashboard.netloc:
        return f"{dashboard.scheme}://{dashboard.netloc}{where}"
    return request.build_absolute_uri(where)


def _connections_page(request, *, slack_form=None, gmail_form=None, status=200):
    tenant = request.member.tenant
    slack = [{"connection": c, "events_url": _webhook_url(request, "slack-events", c.id),
              "interactivity_url": _webhook_url(request, "slack-interactivity", c.id)}
             for c in slack_connection_list(tenant=tenant)]
    gmail = [{"connection": c, "push_url": _webhook_url(request, "gmail-push", c.id)}
             for c in gmail_connection_list(tenant=tenant)]
    return _page(request, "connections.html", {
        "slack": slack, "gmail": gmail, "slack_form": slack_form or SlackConnectionForm(prefix="slack"),
        "gmail_form": gmail_form or GmailConnectionForm(prefix="gmail")}, status=status)


@tenant_page(INTEGRATIONS_MANAGE)
def connections(request, tenant):
    return _connections_page(request)


@tenant_page(INTEGRATIONS_MANAGE)
@require_POST
@transaction.atomic  # the change and its audit entry commit together, or neither
def slack_connection_add(request, tenant):
    form = SlackConnectionForm(request.POST, prefix="slack")
    if form.is_valid():
        try:
            connection = webhooks.slack_connection_create(tenant=request.member.tenant, **form.cleaned_data)
        except ServiceError as exc:
            form.add_error("team_id" if exc.code == "team_already_connected" else None, exc.message)
        else:
            _audit(request, "slack_connection.created", str(connection.id), team_id=connection.team_id)
            messages.success(request, f"Slack team {connection.team_id} is connected: paste its "
                                      "two URLs into the Slack app.")
            return _back(request, "settings-connections")
    return _connections_page(request, slack_form=form, status=400)


@tenant_page(INTEGRATIONS_MANAGE)
@require_POST
@transaction.atomic  # the change and its audit entry commit together, or neither
def gmail_connection_add(request, tenant):
    form = GmailConnectionForm(request.POST, prefix="gmail")
    if form.is_valid():
        try:
            connection = webhooks.gmail_connection_create(tenant=request.member.tenant, **form.cleaned_data)
        except ServiceError as exc:
            form.add_error("email" if exc.code == "mailbox_already_connected" else None, exc.message)
        else:
            _audit(request, "gmail_connection.created", str(connection.id), email=connection.email)
            messages.success(request, f"Mailbox {connection.email} is connected: paste its push URL "
                                      "into the Pub/Sub subscription.")
            return _back(request, "settings-connections")
    return _connections_page(request, gmail_form=form, status=400)


@tenant_page(INTEGRATIONS_MANAGE)
@require_http_methods(["GET", "POST"])
@transaction.atomic  # the change and its audit entry commit together, or neither
def connection_remove(request, tenant, kind: str, connection_id):
    if kind not in CONNECTION_KINDS:
        raise Http404("No such connection.")
    model, listed = CONNECTION_KINDS[kind]
    connection = listed(tenant=request.member.tenant).filter(id=connection_id).first()
    if connection is None:  # another tenant's is not in this tenant's list
        raise Http404("No such connection.")
    what = f"Slack team {connection.team_id}" if kind == "slack" else f"mailbox {connection.email}"
    if request.method == "POST":
        try:
            webhooks.connection_delete(model=model, tenant=request.member.tenant, connection_id=connection.id)
        except ServiceError as exc:
            messages.error(request, exc.message)  # deleted meanwhile by someone else
        else:
            _audit(request, f"{kind}_connection.deleted", str(connection.id), what=what)
            messages.success(request, f"Disconnected {what}.")
        return _back(request, "settings-connections")
    return _page(request, "confirm.html", {
        "heading": f"Disconnect {what}?",
        "explanation": "Its webhook URLs stop answering: events, button clicks or pushes sent to "
                       "them are refused. Connecting it again makes new URLs.",
        "action": "Disconnect", "back": reverse("dashboard:settings-connections", args=[tenant])})


# -- connector credentials -------------------------------------------------------------------------

def _connector_fields(name: str) -> tuple[str, ...]:
    try:
        return connector_get(name).credential_strings
    except LookupError:
        return ()


class CredentialForm(forms.Form):
    connector = forms.ChoiceField(choices=[(name, name) for name in BUILTIN])
    label = forms.CharField(max_length=100, initial="default",
                            help_text="Letters, digits, “.”, “_” or “-”; “default” unless an agent "
                                      "names another.")
    secrets = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 6, "spellcheck": "false", "autocomplete": "off"}),
        help_text='A JSON object, e.g. {"token": "xoxb-…"}. Written, never shown back.')

    def clean_secrets(self):
        try:
            value = json.loads(self.cleaned_data["secrets"])
        except ValueError as exc:
            raise forms.ValidationError(f"This is not valid JSON: {exc}") from None
        except RecursionError:  # deeper than Python's parser goes: far over any credential
            raise forms.ValidationError(self.too_deep()) from None
        if json_shape(value)[0] > settings.API_JSON_MAX_DEPTH:
            raise forms.ValidationError(self.too_deep())
        if not isinstance(value, dict) or not value:
            raise forms.ValidationError("The secrets must be a JSON object with at least one field.")
        return value

    @staticmethod
    def too_deep() -> str:
        return f"The JSON is nested deeper than {settings.API_JSON_MAX_DEPTH} levels."


def _credentials_page(request, form, *, status=200):
    response = _page(request, "credentials.html", {
        "form": form, "credentials": credential_list(),
        "connectors": [(name, _connector_fields(name)) for name in BUILTIN]}, status=status)
    if form.is_bound:
        response["Cache-Control"] = "no-store"  # it may hold the secrets just typed
    return response


@tenant_page(INTEGRATIONS_MANAGE)
@require_http_methods(["GET", "POST"])
@transaction.atomic  # the change and its audit entry commit together, or neither
def credentials(request, tenant):
    form = CredentialForm(request.POST if request.method == "POST" else None)
    if request.method == "POST" and form.is_valid():
        connector, label = form.cleaned_data["connector"], form.cleaned_data["label"]
        existed = credential_find(connector=connector, label=label) is not None
        try:
            credential_set(connector=connector, label=label, secrets=form.cleaned_data["secrets"])
        except ServiceError as exc:
            form.add_error("label" if exc.code == "invalid_label" else "secrets", exc.message)
        else:
            # the field names say which kind of credential it is; the values never leave
            _audit(request, "credential.replaced" if existed else "credential.set",
                   f"{connector}/{label}", fields=sorted(form.cleaned_data["secrets"]))
            messages.success(request, f"The {connector}/{label} credential is "
                                      f"{'replaced' if existed else 'stored'}.")
            return _back(request, "settings-credentials")
    return _credentials_page(request, form, status=400 if form.errors else 200)


@tenant_page(INTEGRATIONS_MANAGE)
@require_http_methods(["GET", "POST"])
@transaction.atomic  # the change and its audit entry commit together, or neither
def credential_remove(request, tenant, connector: str, label: str):
    if credential_find(connector=connector, label=label) is None:
        raise Http404("No such credential.")
    if request.method == "POST":
        if credential_delete(connector=connector, label=label):
            _audit(request, "credential.deleted", f"{connector}/{label}")
            messages.success(request, f"The {connector}/{label} credential is deleted.")
        return _back(request, "settings-credentials")
    return _page(request, "confirm.html", {
        "heading": f"Delete the {connector}/{label} credential?",
        "explanation": "Steps that call this connector with this label fail until a new one is set."
                       + _naming_agents(connector, label),
        "action": "Delete the credential", "back": reverse("dashboard:settings-credentials", args=[tenant])})


def _naming_agents(connector: str, label: str) -> str:
    """What removing a credential breaks among the tenant's own agents, in words."""
    agents = [f"{row.name} v{row.version}" for row in definitions_naming(connector=connector, label=label)]
    if not agents:
        return ""
    breaks = ("their runs fail at the next model turn" if connector == "model" else
              "their calls of it are not made (the model is told why)")
    return f" This tenant's agents name it: {', '.join(agents)}; {breaks} until it is set again."


# -- sandbox egress allow-list -----------------------------------------------------------------------

class EgressForm(forms.Form):
    hosts = forms.CharField(
        label="Hosts to allow", widget=forms.Textarea(attrs={"rows": 3, "spellcheck": "false"}),
        help_text="One a line: api.example.com, *.example.com, api.example.com:8443, or a public IP "
                  "address with a port. Without a port: 80 and 443.")

    def clean_hosts(self):
        hosts = [line.strip() for line in self.cleaned_data["hosts"].splitlines() if line.strip()]
        if not hosts:
            raise forms.ValidationError("Name at least one host.")
        # The proxy runs on the worker's host and connects to an IP named literally even when it
        # is not public (sandboxes.egress): from a tenant's page that would open the platform's
        # own network (its database, Redis, the cloud's metadata) to the tenant's code. Names
        # are checked by the proxy when it resolves them.
        for host in hosts:
            try:
                rule = egress_rule_parse(host)
                ipaddress.ip_address(rule.host)
            except (EgressRuleInvalid, ValueError):
                continue  # a name, or not a rule at all (the service says why)
            refused = address_refusal(rule.host)
            if refused:
                raise forms.ValidationError(f"{host}: {refused}; a tenant may allow only public "
                                            "addresses — nothing was added.")
        return hosts


@tenant_page(INTEGRATIONS_MANAGE)
@require_http_methods(["GET", "POST"])
@transaction.atomic  # the change and its audit entry commit together, or neither
def egress(request, tenant):
    form = EgressForm(request.POST if request.method == "POST" else None)
    if request.method == "POST" and form.is_valid():
        try:
            # all or none: the service parses every host before it stores one
            egress_allow(hosts=form.cleaned_data["hosts"])
        except EgressRuleInvalid as exc:
            form.add_error("hosts", f"{exc} — nothing was added.")
        else:
            _audit(request, "egress.allowed", hosts=form.cleaned_data["hosts"])
            messages.success(request, f"Allowed {', '.join(form.cleaned_data['hosts'])}.")
            return _back(request, "settings-egress")
    return _page(request, "egress.html", {"form": form, "rules": egress_rules()},
                 status=400 if form.errors else 200)


@tenant_page(INTEGRATIONS_MANAGE)
@require_POST
@transaction.atomic  # the change and its audit entry commit together, or neither
def egress_rule_remove(request, tenant):
    rule = request.POST.get("rule", "")
    if not egress_remove(rule=rule):
        raise Http404("No such rule.")
    _audit(request, "egress.removed", rule)
    messages.success(request, f"{rule} is no longer allowed.")
    return _back(request, "settings-egress")


@tenant_page(INTEGRATIONS_MANAGE)
@require_http_methods(["GET", "POST"])
@transaction.atomic  # the change and its audit entry commit together, or neither
def egress_rules_clear(request, tenant):
    if request.method == "POST":
        rules = [str(rule) for rule in egress_rules()]
        egress_clear()
        _audit(request, "egress.cleared", rules=rules)
        messages.success(request, "The allow-list is empty: sandboxes have no network at all.")
        return _back(request, "settings-egress")
    return _page(request, "confirm.html", {
        "heading": "Clear the whole egress allow-list?",
        "explanation": f"All {len(egress_rules())} rule(s) go: from their next sandbox call, this "
                       "tenant's sandboxes reach no host at all.",
        "action": "Clear the allow-list", "back": reverse("dashboard:settings-egress", args=[tenant])})


# -- retention ------------------------------------------------------------------------------------------

class RetentionForm(forms.Form):
    history = forms.ChoiceField(
        choices=[("full", "full: every checkpoint until the time to live"),
                 ("shallow", "shallow: only each run's latest checkpoint")])
    ttl_days = forms.FloatField(label="Time to live (days)", min_value=0.01, max_value=3650,
                                help_text="How long a finished run stays before it is archived and pruned.")


def _days(ttl: timedelta) -> str:
    days = ttl / timedelta(days=1)
    return f"{days:g} day{'s' if days != 1 else ''}"


def _retention_page(request, form=None, *, status=200):
    platform, tenant_wide, own = default_policy(), tenant_policy(), tenant_retention()
    agents = [{"agent": agent, "policy": agent.retention or tenant_wide,
               "source": "the agent's own" if agent.retention else
                         "this tenant's" if own else "platform default",
               "ttl": _days((agent.retention or tenant_wide).ttl)}
              for agent in sorted(registry.all(), key=lambda a: (a.name, a.version))]
    form = form or RetentionForm(initial={"history": tenant_wide.history,
                                          "ttl_days": f"{tenant_wide.ttl / timedelta(days=1):g}"})
    return _page(request, "retention.html", {
        "platform": platform, "platform_ttl": _days(platform.ttl), "own": own,
        "own_ttl": _days(own.ttl) if own else "", "agents": agents, "form": form,
        "overrides": runs_with_own_policy()}, status=status)


@tenant_page(READ)
def retention(request, tenant):
    return _retention_page(request)


@tenant_page(SETTINGS_MANAGE)
@require_POST
@transaction.atomic  # the change and its audit entry commit together, or neither
def retention_set(request, tenant):
    form = RetentionForm(request.POST)
    if form.is_valid():
        history, ttl_days = form.cleaned_data["history"], form.cleaned_data["ttl_days"]
        try:
            tenant_retention_set(history=history, ttl_days=ttl_days, by=request.member.actor)
        except ServiceError as exc:
            form.add_error(None, exc.message)
        else:
            _audit(request, "retention.set", history=history, ttl_days=ttl_days)
            messages.success(request, f"Runs of agents without a policy of their own now keep "
                                      f"{history} history for {ttl_days:g} days, from the next "
                                      "retention pass.")
            return _back(request, "settings-retention")
    return _retention_page(request, form, status=400)


@tenant_page(SETTINGS_MANAGE)
@require_POST
@transaction.atomic  # the change and its audit entry commit together, or neither
def retention_reset(request, tenant):
    if tenant_retention_clear():
        _audit(request, "retention.reset")
        messages.success(request, "This tenant follows the platform's default policy again.")
    return _back(request, "settings-retention")


urlpatterns = [
    path("settings", settings_index, name="settings"),
    path("settings/api-keys", api_keys, name="settings-api-keys"),
    path("settings/api-keys/<int:key_id>/revoke", api_key_revoke_page, name="settings-api-key-revoke"),
    path("settings/connections", connections, name="settings-connections"),
    path("settings/connections/slack", slack_connection_add, name="settings-slack-add"),
    path("settings/connections/gmail", gmail_connection_add, name="settings-gmail-add"),
    path("settings/connections/<str:kind>/<uuid:connection_id>/delete", connection_remove,
         name="settings-connection-delete"),
    path("settings/credentials", credentials, name="settings-credentials"),
    path("settings/credentials/<str:connector>/<str:label>/delete", credential_remove,
         name="settings-credential-delete"),
    path("settings/egress", egress, name="settings-egress"),
    path("settings/egress/remove", egress_rule_remove, name="settings-egress-remove"),
    path("settings/egress/clear", egress_rules_clear, name="settings-egress-clear"),
    path("settings/retention", retention, name="settings-retention"),
    path("settings/retention/set", retention_set, name="settings-retention-set"),
    path("settings/retention/reset", retention_reset, name="settings-retention-reset"),
]
