"""The settings pages: API keys, Slack and Gmail connections, connector credentials, the sandbox
egress allow-list and the retention policy. Each action through the dashboard happened (read
back through the services the API uses), was audited with who did it, is refused to the roles
without the permission (403), and cannot reach another tenant's objects (404)."""

import json
import uuid
from datetime import timedelta

import pytest
from django.test import Client
from django_tenants.utils import tenant_context

from dashboard.views import settings as settings_views
from integrations.models import Credential
from integrations.selectors import credential_find
from integrations.services import credential_get, credential_set
from integrations.webhooks.models import GmailConnection, SlackConnection
from integrations.webhooks.services import gmail_connection_create, slack_connection_create
from runs.models import Checkpoint
from runs.retention import services as retention
from runs.retention.models import Archive, TenantRetention
from runs.retention.selectors import tenant_policy
from sandboxes.selectors import egress_rules
from sandboxes.services import egress_allow, egress_clear, egress_remove
from tenants.models import ApiKey, AuditEntry
from tenants.people import actor_of
from tenants.services import api_key_authenticate, api_key_create
from tests.retention.conftest import run_finished

from .conftest import person, signed_in


@pytest.fixture(autouse=True)
def leaves_no_trace(acme, globex):
    """The test database is shared by the session: what a test here adds (keys, connections,
    credentials, egress rules) goes again afterwards, so tests elsewhere see what they expect."""
    tenants = (acme, globex)
    keys = set(ApiKey.objects.values_list("pk", flat=True))
    slack = set(SlackConnection.objects.values_list("pk", flat=True))
    gmail = set(GmailConnection.objects.values_list("pk", flat=True))
    before = {}
    for tenant in tenants:
        with tenant_context(tenant):
            before[tenant.pk] = (set(Credential.objects.values_list("pk", flat=True)),
                                 [str(rule) for rule in egress_rules()])
    yield
    ApiKey.objects.exclude(pk__in=keys).delete()
    SlackConnection.objects.exclude(pk__in=slack).delete()
    GmailConnection.objects.exclude(pk__in=gmail).delete()
    for tenant in tenants:
        credentials, rules = before[tenant.pk]
        with tenant_context(tenant):
            Credential.objects.exclude(pk__in=credentials).delete()
            egress_clear()
            if rules:
                egress_allow(hosts=rules)


MANAGE_ONLY_OWNER = ["admin", "operator", "approver", "viewer"]
NO_INTEGRATIONS = ["operator", "approver", "viewer"]


def owner_of(tenant):
    user = person(tenant, "owner")
    return user, signed_in(user)


def audited(tenant, action: str, **match) -> AuditEntry:
    entry = AuditEntry.objects.filter(tenant=tenant, action=action, **match).order_by("-id").first()
    assert entry is not None, f"no {action} audit entry matching {match}"
    return entry


def rules_of(tenant) -> list[str]:
    with tenant_context(tenant):
        return [str(rule) for rule in egress_rules()]


# -- the index -------------------------------------------------------------------------------

def test_the_index_links_each_role_to_the_pages_it_may_use(acme, as_role):
    owner = as_role("owner").get("/t/acme/settings")
    assert owner.status_code == 200
    for page in (b"/settings/api-keys", b"/settings/connections", b"/settings/credentials",
                 b"/settings/egress", b"/settings/retention"):
        assert page in owner.content
    admin = as_role("admin").get("/t/acme/settings").content
    assert b"/settings/api-keys" not in admin and b"/settings/credentials" in admin
    viewer = as_role("viewer").get("/t/acme/settings").content
    assert b"/settings/credentials" not in viewer and b"/settings/retention" in viewer
    assert b'aria-current="page">Settings' in owner.content


def test_a_signed_out_visitor_and_another_tenant_are_kept_out(acme, globex):
    assert Client().get("/t/acme/settings/api-keys").status_code == 302
    _, client = owner_of(acme)
    for page in ("settings", "settings/api-keys", "settings/connections", "settings/credentials",
                 "settings/egress", "settings/retention"):
        assert client.get(f"/t/globex/{page}").status_code == 404, page


# -- API keys -----------------------------------------------------------------------------------

def test_an_owner_creates_a_key_seen_once_that_works_with_its_scopes(acme):
    user, client = owner_of(acme)
    name = f"billing {uuid.uuid4().hex[:6]}"
    response = client.post("/t/acme/settings/api-keys", {"name": name, "scopes": ["runs:read", "admin"]})
    assert response.status_code == 200
    assert "no-store" in response["Cache-Control"]
    key = ApiKey.objects.get(tenant=acme, name=name)
    plaintext = response.context["plaintext"]
    assert plaintext.startswith(f"ap_{key.prefix}_") and plaintext.encode() in response.content
    assert key.scopes == ["runs:read", "admin"]
    assert api_key_authenticate(presented=plaintext).pk == key.pk  # the key shown is the key

    listing = client.get("/t/acme/settings/api-keys")
    assert f"ap_{key.prefix}_".encode() in listing.content and name.encode() in listing.content
    assert plaintext.encode() not in listing.content  # never again
    entry = audited(acme, "api_key.created", target=f"ap_{key.prefix}")
    assert entry.actor == actor_of(user) and entry.detail == {"name": name, "scopes": ["runs:read", "admin"]}
    assert plaintext not in json.dumps(entry.detail) + entry.target


def test_a_key_without_scopes_or_name_is_refused_with_the_form_kept(acme):
    _, client = owner_of(acme)
    before = ApiKey.objects.filter(tenant=acme).count()
    response = client.post("/t/acme/settings/api-keys", {"name": "kept name"})
    assert response.status_code == 400 and b"Pick at least one scope." in response.content
    assert b'value="kept name"' in response.content
    response = client.post("/t/acme/settings/api-keys", {"name": "", "scopes": ["runs:read"]})
    assert response.status_code == 400 and b"This field is required." in response.content
    assert b'value="runs:read" checked' in response.content or b'checked' in response.content
    response = client.post("/t/acme/settings/api-keys", {"name": "x", "scopes": ["root"]})
    assert response.status_code == 400 and b"not one of the available choices" in response.content
    assert ApiKey.objects.filter(tenant=acme).count() == before


def test_an_empty_post_is_an_error_not_the_page_again(acme):
    _, client = owner_of(acme)
    for page in ("api-keys", "credentials", "egress"):
        response = client.post(f"/t/acme/settings/{page}", {})
        assert response.status_code == 400 and b"field-error" in response.content, page


def test_an_owner_revokes_a_key_after_confirming(acme):
    user, client = owner_of(acme)
    key, plaintext = api_key_create(tenant=acme, name="to revoke", scopes=["runs:read"])
    confirm = client.get(f"/t/acme/settings/api-keys/{key.id}/revoke")
    assert confirm.status_code == 200 and b"csrfmiddlewaretoken" in confirm.content
    assert ApiKey.objects.get(pk=key.pk).revoked_at is None  # a GET only asks
    response = client.post(f"/t/acme/settings/api-keys/{key.id}/revoke")
    assert response.status_code == 302
    assert ApiKey.objects.get(pk=key.pk).revoked_at is not None
    with pytest.raises(Exception, match="revoked"):
        api_key_authenticate(presented=plaintext)
    assert audited(acme, "api_key.revoked", target=f"ap_{key.prefix}").actor == actor_of(user)
    listing = client.get("/t/acme/settings/api-keys").content.decode()
    assert "revoked" in listing


def test_another_tenants_key_cannot_be_revoked(acme, globex):
    _, client = owner_of(acme)
    theirs, _ = api_key_create(tenant=globex, name="globex's", scopes=["runs:read"])
    assert client.get(f"/t/acme/settings/api-keys/{theirs.id}/revoke").status_code == 404
    assert client.post(f"/t/acme/settings/api-keys/{theirs.id}/revoke").status_code == 404
    assert ApiKey.objects.get(pk=theirs.pk).revoked_at is None
    assert b"globex's" not in client.get("/t/acme/settings/api-keys").content


@pytest.mark.parametrize("role", MANAGE_ONLY_OWNER)
def test_only_owners_manage_keys(acme, as_role, role):
    client = as_role(role)
    key, _ = api_key_create(tenant=acme, name="kept", scopes=["runs:read"])
    assert client.get("/t/acme/settings/api-keys").status_code == 403
    assert client.post("/t/acme/settings/api-keys", {"name": "n", "scopes": ["admin"]}).status_code == 403
    assert client.post(f"/t/acme/settings/api-keys/{key.id}/revoke").status_code == 403
    assert ApiKey.objects.get(pk=key.pk).revoked_at is None
    assert not ApiKey.objects.filter(tenant=acme, name="n").exists()


def test_forms_carry_csrf_and_a_post_without_it_is_refused(acme):
    user = person(acme, "owner")
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    for page in ("api-keys", "connections", "credentials", "egress"):
        assert b"csrfmiddlewaretoken" in client.get(f"/t/acme/settings/{page}").content, page
    assert client.post("/t/acme/settings/api-keys", {"name": "n", "scopes": ["admin"]}).status_code == 403
    assert client.post("/t/acme/settings/egress", {"hosts": "csrf.example.com"}).status_code == 403
    assert "csrf.example.com" not in rules_of(acme)


# -- Slack and Gmail connections -------------------------------------------------------------------

def test_an_admin_connects_slack_and_sees_the_urls_but_never_the_secret(acme, settings):
    settings.DASHBOARD_URL = "https://dash.example.com/app/"
    user = person(acme, "admin")
    client = signed_in(user)
    team = f"T{uuid.uuid4().hex[:8].upper()}"
    response = client.post("/t/acme/settings/connections/slack", {
        "slack-team_id": team, "slack-signing_secret": "s3cret-signing", "slack-approvals_channel": "C1"})
    assert response.status_code == 302
    connection = SlackConnection.objects.get(tenant=acme, team_id=team)
    page = client.get("/t/acme/settings/connections").content.decode()
    assert f"https://dash.example.com/webhooks/slack/{connection.id}/events" in page
    assert f"https://dash.example.com/webhooks/slack/{connection.id}/interactivity" in page
    assert "s3cret-signing" not in page
    entry = audited(acme, "slack_connection.created", target=str(connection.id))
    assert entry.actor == actor_of(user) and "s3cret" not in json.dumps(entry.detail)

    again = client.post("/t/acme/settings/connections/slack", {
        "slack-team_id": team, "slack-signing_secret": "other"})
    assert again.status_code == 400 and b"already connected" in again.content
    assert f'value="{team}"'.encode() in again.content and b"other" not in again.content


def test_webhook_urls_use_the_requests_host_without_dashboard_url(acme, settings):
    settings.DASHBOARD_URL = ""
    _, client = owner_of(acme)
    connection = slack_connection_create(tenant=acme, team_id=f"T{uuid.uuid4().hex[:8]}",
                                         signing_secret="x")
    page = client.get("/t/acme/settings/connections", HTTP_HOST="localhost").content.decode()
    assert f"http://localhost/webhooks/slack/{connection.id}/events" in page


def test_a_gmail_mailbox_is_connected_with_its_push_url_and_bad_input_kept(acme):
    user = person(acme, "owner")
    client = signed_in(user)
    email = f"inbox-{uuid.uuid4().hex[:6]}@acme.test"
    bad = client.post("/t/acme/settings/connections/gmail", {
        "gmail-email": "not an email", "gmail-audience": "aud-1",
        "gmail-service_account_email": "push@acme.iam.test"})
    assert bad.status_code == 400 and b"Enter a valid email address." in bad.content
    assert b'value="aud-1"' in bad.content
    response = client.post("/t/acme/settings/connections/gmail", {
        "gmail-email": email, "gmail-audience": "aud-1",
        "gmail-service_account_email": "push@acme.iam.test"})
    assert response.status_code == 302
    connection = GmailConnection.objects.get(tenant=acme, email=email)
    assert f"/webhooks/gmail/{connection.id}".encode() in client.get("/t/acme/settings/connections").content
    assert audited(acme, "gmail_connection.created", target=str(connection.id)).actor == actor_of(user)


def test_a_connection_is_deleted_after_confirming_and_another_tenants_is_404(acme, globex):
    user, client = owner_of(acme)
    ours = gmail_connection_create(tenant=acme, email=f"a-{uuid.uuid4().hex[:6]}@acme.test",
                                   audience="a", service_account_email="s@acme.test")
    theirs = slack_connection_create(tenant=globex, team_id=f"T{uuid.uuid4().hex[:8]}",
                                     signing_secret="x")
    assert client.get(f"/t/acme/settings/connections/gmail/{ours.id}/delete").status_code == 200
    assert client.post(f"/t/acme/settings/connections/gmail/{ours.id}/delete").status_code == 302
    assert not GmailConnection.objects.filter(id=ours.id).exists()
    assert audited(acme, "gmail_connection.deleted", target=str(ours.id)).actor == actor_of(user)
    assert client.post(f"/t/acme/settings/connections/slack/{theirs.id}/delete").status_code == 404
    assert client.post(f"/t/acme/settings/connections/nosuch/{theirs.id}/delete").status_code == 404
    assert SlackConnection.objects.filter(id=theirs.id).exists()


@pytest.mark.parametrize("role", NO_INTEGRATIONS)
def test_connections_are_refused_to_roles_without_integrations(acme, as_role, role):
    client = as_role(role)
    connection = slack_connection_create(tenant=acme, team_id=f"T{uuid.uuid4().hex[:8]}",
                                         signing_secret="x")
    assert client.get("/t/acme/settings/connections").status_code == 403
    assert client.post("/t/acme/settings/connections/slack", {
        "slack-team_id": "TNEVER", "slack-signing_secret": "x"}).status_code == 403
    assert client.post("/t/acme/settings/connections/gmail", {}).status_code == 403
    assert client.post(f"/t/acme/settings/connections/slack/{connection.id}/delete").status_code == 403
    assert SlackConnection.objects.filter(id=connection.id).exists()
    assert not SlackConnection.objects.filter(team_id="TNEVER").exists()


# -- connector credentials -------------------------------------------------------------------------

def test_a_credential_is_set_never_shown_and_replaced(acme):
    user = person(acme, "admin")
    client = signed_in(user)
    label = f"bot-{uuid.uuid4().hex[:6]}"
    response = client.post("/t/acme/settings/credentials", {
        "connector": "slack", "label": label, "secrets": '{"token": "xoxb-very-secret"}'})
    assert response.status_code == 302
    with tenant_context(acme):
        assert credential_get(connector="slack", label=label) == {"token": "xoxb-very-secret"}
    page = client.get("/t/acme/settings/credentials").content.decode()
    assert label in page and "xoxb-very-secret" not in page
    entry = audited(acme, "credential.set", target=f"slack/{label}")
    assert entry.actor == actor_of(user) and entry.detail == {"fields": ["token"]}

    client.post("/t/acme/settings/credentials", {
        "connector": "slack", "label": label, "secrets": '{"token": "xoxb-newer"}'})
    with tenant_context(acme):
        assert credential_get(connector="slack", label=label) == {"token": "xoxb-newer"}
    assert "xoxb" not in json.dumps(audited(acme, "credential.replaced", target=f"slack/{label}").detail)


@pytest.mark.parametrize("secrets, error", [
    ('{"token": ', "This is not valid JSON"),
    ('["token"]', "must be a JSON object"),
    ('{"token": 42}', "&#x27;token&#x27; must be a string"),
])
def test_bad_secrets_are_shown_inline_to_the_person_who_typed_them(acme, secrets, error):
    _, client = owner_of(acme)
    label = f"bad-{uuid.uuid4().hex[:6]}"
    response = client.post("/t/acme/settings/credentials", {
        "connector": "slack", "label": label, "secrets": secrets})
    assert response.status_code == 400 and error.encode() in response.content, response.content[-3000:]
    assert "no-store" in response["Cache-Control"]
    assert f'value="{label}"'.encode() in response.content  # nothing typed is lost
    with tenant_context(acme):
        assert credential_find(connector="slack", label=label) is None


def test_a_bad_label_is_refused_by_the_service(acme):
    _, client = owner_of(acme)
    response = client.post("/t/acme/settings/credentials", {
        "connector": "slack", "label": "no spaces", "secrets": '{"token": "t"}'})
    assert response.status_code == 400 and b"is not a valid label" in response.content


def test_a_credential_is_deleted_after_confirming_and_another_tenants_is_404(acme, globex):
    user, client = owner_of(acme)
    label = f"del-{uuid.uuid4().hex[:6]}"
    with tenant_context(acme):
        credential_set(connector="webhook", label=label, secrets={"url": "http://127.0.0.1/"})
    with tenant_context(globex):
        credential_set(connector="webhook", label=f"{label}-g", secrets={"url": "http://127.0.0.1/"})
    assert client.get(f"/t/acme/settings/credentials/webhook/{label}/delete").status_code == 200
    assert client.post(f"/t/acme/settings/credentials/webhook/{label}/delete").status_code == 302
    with tenant_context(acme):
        assert credential_find(connector="webhook", label=label) is None
    assert audited(acme, "credential.deleted", target=f"webhook/{label}").actor == actor_of(user)
    assert client.post(f"/t/acme/settings/credentials/webhook/{label}-g/delete").status_code == 404
    with tenant_context(globex):
        assert credential_find(connector="webhook", label=f"{label}-g") is not None


@pytest.mark.parametrize("role", NO_INTEGRATIONS)
def test_credentials_are_refused_to_roles_without_integrations(acme, as_role, role):
    client = as_role(role)
    with tenant_context(acme):
        credential_set(connector="webhook", label="kept", secrets={"url": "http://127.0.0.1/"})
    assert client.get("/t/acme/settings/credentials").status_code == 403
    assert client.post("/t/acme/settings/credentials", {
        "connector": "slack", "label": "never", "secrets": '{"token": "t"}'}).status_code == 403
    assert client.post("/t/acme/settings/credentials/webhook/kept/delete").status_code == 403
    with tenant_context(acme):
        assert credential_find(connector="slack", label="never") is None
        assert credential_find(connector="webhook", label="kept") is not None


# -- sandbox egress ------------------------------------------------------------------------------

def test_hosts_are_allowed_removed_and_cleared(acme):
    with tenant_context(acme):
        egress_clear()
    user = person(acme, "admin")
    client = signed_in(user)
    response = client.post("/t/acme/settings/egress", {"hosts": "api.example.com\n*.example.org:8443\n"})
    assert response.status_code == 302
    assert rules_of(acme) == ["api.example.com", "*.example.org:8443"]
    assert audited(acme, "egress.allowed").detail == {"hosts": ["api.example.com", "*.example.org:8443"]}
    page = client.get("/t/acme/settings/egress").content.decode()
    assert "*.example.org:8443" in page and "80, 443" in page

    assert client.post("/t/acme/settings/egress/remove", {"rule": "api.example.com"}).status_code == 302
    assert rules_of(acme) == ["*.example.org:8443"]
    assert audited(acme, "egress.removed", target="api.example.com").actor == actor_of(user)
    assert client.post("/t/acme/settings/egress/remove", {"rule": "api.example.com"}).status_code == 404

    assert client.get("/t/acme/settings/egress/clear").status_code == 200
    assert rules_of(acme) == ["*.example.org:8443"]  # a GET only asks
    assert client.post("/t/acme/settings/egress/clear").status_code == 302
    assert rules_of(acme) == []
    assert audited(acme, "egress.cleared").detail == {"rules": ["*.example.org:8443"]}


def test_a_bad_host_adds_nothing_and_is_shown_with_what_was_typed(acme):
    with tenant_context(acme):
        egress_clear()
    _, client = owner_of(acme)
    response = client.post("/t/acme/settings/egress", {"hosts": "good.example.com\nbad host!"})
    assert response.status_code == 400
    assert b"is not a host name" in response.content and b"nothing was added" in response.content
    assert b"good.example.com\nbad host!" in response.content
    assert rules_of(acme) == []


def test_another_tenants_rules_are_not_reachable(acme, globex):
    with tenant_context(globex):
        egress_allow(hosts=["globex-only.example.com"])
    _, client = owner_of(acme)
    assert b"globex-only" not in client.get("/t/acme/settings/egress").content
    removed = client.post("/t/acme/settings/egress/remove", {"rule": "globex-only.example.com"})
    assert removed.status_code == 404
    assert "globex-only.example.com" in rules_of(globex)


@pytest.mark.parametrize("role", NO_INTEGRATIONS)
def test_egress_is_refused_to_roles_without_integrations(acme, as_role, role):
    with tenant_context(acme):
        egress_allow(hosts=["kept.example.com"])
    client = as_role(role)
    assert client.get("/t/acme/settings/egress").status_code == 403
    assert client.post("/t/acme/settings/egress", {"hosts": "never.example.com"}).status_code == 403
    assert client.post("/t/acme/settings/egress/remove", {"rule": "kept.example.com"}).status_code == 403
    assert client.post("/t/acme/settings/egress/clear").status_code == 403
    assert "kept.example.com" in rules_of(acme) and "never.example.com" not in rules_of(acme)


def test_egress_remove_takes_any_spelling_of_a_rule(in_acme):
    egress_clear()
    egress_allow(hosts=["API.example.com:443"])
    assert egress_remove(rule="not a rule!") is False
    assert egress_remove(rule=str(egress_rules()[0])) is True
    assert egress_rules() == []


# -- retention ------------------------------------------------------------------------------------

@pytest.fixture
def tenant_retention_reset(acme):
    """The tenant's own policy is gone again after the test: other tests expect the platform's."""
    yield
    with tenant_context(acme):
        retention.tenant_retention_clear()


@pytest.fixture
def acme_pass(s3, acme):
    """acme's real archive pass, against the session's S3."""
    def run_pass():
        with tenant_context(acme):
            return retention.archive_pass(tenant=acme)
    return run_pass


def archived(tenant, run_id) -> bool:
    with tenant_context(tenant):
        return Archive.objects.filter(run_id=run_id, status=Archive.Status.ARCHIVED).exists()


def test_the_retention_page_shows_the_platform_and_agent_policies(acme, as_role, settings):
    settings.RETENTION_TTL_DAYS = 30.0
    page = as_role("viewer").get("/t/acme/settings/retention")
    assert page.status_code == 200
    text = page.content.decode()
    assert "30 days after the run ends" in text and "follows the platform's default" in text
    assert "tidy v1" in text and "the agent&#x27;s own" in text and "1 day" in text
    assert "Save the policy" not in text  # a viewer sees no action


def test_a_tenant_ttl_set_in_the_dashboard_decides_what_the_archive_pass_archives(
        acme, acme_pass, tenant_retention_reset):
    user, client = owner_of(acme)
    with tenant_context(acme):
        ten_days = run_finished(age=timedelta(days=10))  # chatter declares no policy
    acme_pass()
    assert not archived(acme, ten_days.id)  # the platform's 30 days

    response = client.post("/t/acme/settings/retention/set", {"history": "full", "ttl_days": "7"})
    assert response.status_code == 302
    with tenant_context(acme):
        own = TenantRetention.objects.get()
        assert (own.history, own.ttl, own.updated_by) == ("full", timedelta(days=7), actor_of(user))
    entry = audited(acme, "retention.set")
    assert entry.actor == actor_of(user) and entry.detail == {"history": "full", "ttl_days": 7.0}
    assert "7 days after the run ends" in client.get("/t/acme/settings/retention").content.decode()

    acme_pass()
    assert archived(acme, ten_days.id)


def test_an_agents_own_policy_wins_over_the_tenants(acme, acme_pass, tenant_retention_reset):
    _, client = owner_of(acme)
    client.post("/t/acme/settings/retention/set", {"history": "full", "ttl_days": "90"})
    with tenant_context(acme):
        plain = run_finished(age=timedelta(days=40))  # past the platform's 30, within the tenant's 90
        tidy = run_finished(agent="tidy", age=timedelta(days=2))  # past its own 1 day
    acme_pass()
    assert not archived(acme, plain.id) and archived(acme, tidy.id)
    page = client.get("/t/acme/settings/retention").content.decode()
    assert "this tenant&#x27;s" in page and "90 days" in page


def test_a_shallow_tenant_policy_compacts_on_the_next_pass_and_reset_restores_the_default(
        acme, acme_pass, tenant_retention_reset):
    user, client = owner_of(acme)
    with tenant_context(acme):
        run = run_finished(steps=6, age=timedelta(hours=1))
        assert Checkpoint.objects.filter(run_id=run.id).count() > 1
    client.post("/t/acme/settings/retention/set", {"history": "shallow", "ttl_days": "30"})
    acme_pass()
    with tenant_context(acme):
        assert Checkpoint.objects.filter(run_id=run.id).count() == 1

    assert client.post("/t/acme/settings/retention/reset").status_code == 302
    with tenant_context(acme):
        assert not TenantRetention.objects.exists()
        assert tenant_policy() == retention.selectors.default_policy()
    assert audited(acme, "retention.reset").actor == actor_of(user)


@pytest.mark.parametrize("data, error", [
    ({"history": "full", "ttl_days": "0"}, "greater than or equal to 0.01"),
    ({"history": "full", "ttl_days": "soon"}, "Enter a number."),
    ({"history": "deep", "ttl_days": "5"}, "not one of the available choices"),
])
def test_a_bad_policy_is_refused_inline_with_what_was_typed(acme, data, error, tenant_retention_reset):
    _, client = owner_of(acme)
    response = client.post("/t/acme/settings/retention/set", data)
    assert response.status_code == 400 and error.encode() in response.content
    assert f'value="{data["ttl_days"]}"'.encode() in response.content
    with tenant_context(acme):
        assert not TenantRetention.objects.exists()


def test_the_service_refuses_what_the_form_would_not_send(in_acme):
    with pytest.raises(retention.RetentionError):
        retention.tenant_retention_set(history="full", ttl_days=0, by="test")
    with pytest.raises(retention.RetentionError):
        retention.tenant_retention_set(history="deep", ttl_days=1, by="test")


@pytest.mark.parametrize("role", MANAGE_ONLY_OWNER)
def test_only_owners_set_the_retention_policy(acme, as_role, role, tenant_retention_reset):
    client = as_role(role)
    assert client.get("/t/acme/settings/retention").status_code == 200
    assert b"Save the policy" not in client.get("/t/acme/settings/retention").content
    refused = client.post("/t/acme/settings/retention/set", {"history": "shallow", "ttl_days": "1"})
    assert refused.status_code == 403
    assert client.post("/t/acme/settings/retention/reset").status_code == 403
    with tenant_context(acme):
        assert not TenantRetention.objects.exists()


def test_a_change_whose_audit_entry_fails_is_not_made(acme, monkeypatch):
    with tenant_context(acme):
        egress_clear()
    _, client = owner_of(acme)

    def audit_down(**_):
        raise RuntimeError("audit log unavailable")

    monkeypatch.setattr(settings_views, "audit_record", audit_down)
    with pytest.raises(RuntimeError):
        client.post("/t/acme/settings/egress", {"hosts": "unaudited.example.com"})
    assert rules_of(acme) == []
