"""Per-tenant connector credentials: sealed with the tenant's data key, bound to tenant,
connector and label, and never shown by the API or written to logs."""

import logging
import uuid

import pytest
from django.db import connection
from django_tenants.utils import tenant_context

from integrations.connectors import Call, connector_get
from integrations.models import Credential
from integrations.services import (
    CredentialError,
    CredentialNotFound,
    credential_delete,
    credential_get,
    credential_open,
    credential_set,
)
from tenants.services import data_key_get
from tests.support.api import api_client

TOKEN = "xoxb-acme-very-secret-token"


@pytest.fixture
def clean(acme, globex):
    for tenant in (acme, globex):
        with tenant_context(tenant):
            Credential.objects.all().delete()
    yield
    for tenant in (acme, globex):
        with tenant_context(tenant):
            Credential.objects.all().delete()


def test_secrets_are_stored_encrypted_and_read_back(clean, acme):
    with tenant_context(acme):
        credential_set(connector="slack", secrets={"token": TOKEN})
        row = Credential.objects.get(connector="slack", label="default")
        stored = bytes(row.ciphertext)
        assert TOKEN.encode() not in stored and b"token" not in stored
        assert row.key_version == data_key_get(tenant=acme)[0]
        assert credential_get(connector="slack") == {"token": TOKEN}

        credential_set(connector="slack", secrets={"token": "xoxb-new"})  # replaces
        assert bytes(Credential.objects.get(pk=row.pk).ciphertext) != stored
        assert credential_get(connector="slack") == {"token": "xoxb-new"}


def test_the_same_secret_seals_differently_each_time(clean, acme):
    with tenant_context(acme):
        first = bytes(credential_set(connector="slack", label="a", secrets={"token": TOKEN}).ciphertext)
        second = bytes(credential_set(connector="slack", label="b", secrets={"token": TOKEN}).ciphertext)
    assert first[:12] != second[:12] and first[12:] != second[12:]


def test_another_tenants_key_cannot_open_them(clean, acme, globex):
    with tenant_context(acme):
        credential_set(connector="payments", secrets={"secret_key": "sk_live_acme"})
        stolen = Credential.objects.get(connector="payments")
        ciphertext, version = bytes(stolen.ciphertext), stolen.key_version
    with tenant_context(globex):  # the row copied into globex's schema, byte for byte
        copied = Credential.objects.create(connector="payments", ciphertext=ciphertext,
                                           key_version=version)
        with pytest.raises(CredentialError, match="not sealed for this tenant") as raised:
            credential_get(connector="payments")
        assert raised.value.code == "credential_undecryptable"
        assert "sk_live_acme" not in str(raised.value)
        copied.delete()


def test_a_credential_moved_to_another_connector_or_label_does_not_open(clean, acme):
    with tenant_context(acme):
        credential_set(connector="payments", secrets={"secret_key": "sk_live_acme"})
        Credential.objects.filter(connector="payments").update(connector="webhook")
        with pytest.raises(CredentialError, match="cannot decrypt the webhook/default"):
            credential_get(connector="webhook")
        credential_set(connector="model", label="cheap", secrets={"api_key": "sk-1"})
        Credential.objects.filter(connector="model").update(label="default")
        with pytest.raises(CredentialError):
            credential_get(connector="model")


def test_one_tenant_cannot_reach_anothers_credentials(clean, acme, globex):
    with tenant_context(acme):
        credential_set(connector="slack", secrets={"token": TOKEN})
    with tenant_context(globex):
        with pytest.raises(CredentialNotFound):
            credential_get(connector="slack")
        assert credential_get(connector="slack", missing_ok=True) == {}
        assert credential_delete(connector="slack") is False
    with tenant_context(acme):
        assert credential_get(connector="slack") == {"token": TOKEN}
        assert credential_delete(connector="slack") is True
        assert not Credential.objects.exists()


def test_credentials_need_a_tenant(clean):
    connection.set_schema_to_public()
    with pytest.raises(CredentialError, match="no tenant is selected"):
        credential_set(connector="slack", secrets={"token": TOKEN})


def test_names_and_secrets_are_validated(clean, acme):
    with tenant_context(acme):
        for kwargs, code in [({"connector": "Bad Name", "secrets": {"a": 1}}, "invalid_connector"),
                             ({"connector": "slack", "label": "", "secrets": {"a": 1}}, "invalid_label"),
                             # `$` alone would let a trailing newline through
                             ({"connector": "slack", "label": "ops\n", "secrets": {"a": 1}}, "invalid_label"),
                             ({"connector": "slack\n", "secrets": {"a": 1}}, "invalid_connector"),
                             ({"connector": "slack", "secrets": {}}, "invalid_secrets"),
                             ({"connector": "slack", "secrets": {"a": "x" * 20000}}, "invalid_secrets")]:
            with pytest.raises(CredentialError) as raised:
                credential_set(**kwargs)
            assert raised.value.code == code


@pytest.mark.parametrize("connector, secrets", [
    ("email", {"host": "mx.acme.test", "username": None, "password": None}),
    ("email", {"host": "mx.acme.test", "use_tls": "false"}),
    ("email", {"host": "mx.acme.test", "port": "twenty-five"}),
    ("email", {"host": "mx.acme.test", "use_tls": True, "use_ssl": True}),
    ("slack", {"token": None}),
    ("webhook", {"signing_secret": 12345}),
    ("payments", {"secret_key": ["sk_test_x"]}),
    ("model", {"api_key": "sk-x", "base_url": {"url": "http://127.0.0.1/"}}),
])
def test_a_credential_of_the_wrong_shape_for_its_connector_is_refused(clean, acme, connector,
                                                                      secrets):
    with tenant_context(acme):
        with pytest.raises(CredentialError) as raised:
            credential_set(connector=connector, secrets=secrets)
        assert raised.value.code == "invalid_secrets"
        assert not Credential.objects.exists()


def test_the_api_refuses_a_null_smtp_login_with_a_clear_400(clean, acme_api, globex_api):
    url = "/api/v1/credentials/email/default"
    response = acme_api.put(url, {"secrets": {"host": "mx.acme.test", "username": None,
                                              "password": None}}, format="json")
    assert response.status_code == 400, response.content
    assert response.json()["error"]["code"] == "invalid_secrets"
    assert "'username' must be a string" in response.json()["error"]["message"]
    good = {"secrets": {"host": "mx.globex.test", "username": "globex", "password": "pw",
                        "port": 587, "use_tls": True}}
    assert globex_api.put(url, good, format="json").status_code == 201
    assert acme_api.get(url).status_code == 404


def test_the_api_sets_lists_and_deletes_without_showing_secrets(clean, acme_api, globex_api, caplog):
    caplog.set_level(logging.DEBUG)
    url = "/api/v1/credentials/slack/default"
    created = acme_api.put(url, {"secrets": {"token": TOKEN}}, format="json")
    assert created.status_code == 201, created.content
    assert created.json()["connector"] == "slack" and TOKEN not in created.content.decode()
    assert acme_api.put(url, {"secrets": {"token": TOKEN}}, format="json").status_code == 200

    listed = acme_api.get("/api/v1/credentials")
    assert [(c["connector"], c["label"]) for c in listed.json()["results"]] == [("slack", "default")]
    assert set(listed.json()["results"][0]) == {"connector", "label", "key_version", "created_at",
                                                "updated_at"}
    assert TOKEN not in listed.content.decode()
    assert TOKEN not in acme_api.get(url).content.decode()

    assert globex_api.get("/api/v1/credentials").json()["results"] == []
    assert globex_api.get(url).status_code == 404
    assert globex_api.delete(url).status_code == 404

    assert acme_api.delete(url).status_code == 204
    assert acme_api.get(url).json()["error"]["code"] == "not_found"
    assert TOKEN not in caplog.text


def test_the_api_rejects_bad_requests_with_codes(clean, acme_api):
    cases = [("/api/v1/credentials/nosuch/default", {"secrets": {"a": "b"}}, "unknown_connector"),
             ("/api/v1/credentials/slack/default", {"secrets": "not an object"}, "invalid_request"),
             ("/api/v1/credentials/slack/default", {}, "invalid_request"),
             ("/api/v1/credentials/slack/default", {"secrets": {}}, "invalid_request"),  # minProperties
             ("/api/v1/credentials/slack/bad%20label", {"secrets": {"a": "b"}}, "invalid_label")]
    for url, body, code in cases:
        response = acme_api.put(url, body, format="json")
        assert response.status_code == 400, (url, response.content)
        assert response.json()["error"]["code"] == code

    assert api_client(None).get("/api/v1/credentials").status_code == 401


def test_connectors_never_log_credentials(clean, acme, fake_slack, fake_stripe, fake_openai, caplog):
    caplog.set_level(logging.DEBUG)
    with tenant_context(acme):
        credential_set(connector="slack", secrets={"token": TOKEN, "api_url": f"{fake_slack.url}/api"})
        credential_set(connector="payments", secrets={"secret_key": "sk_test_hidden",
                                                      "api_url": fake_stripe.url})
        credential_set(connector="model", secrets={"api_key": "sk-hidden",
                                                   "base_url": f"{fake_openai.url}/v1"})
        calls = {
            "slack": {"channel": "C1", "text": "hi"},
            "payments": {"amount": 100, "currency": "usd", "source": "tok_visa"},
            "model": {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]},
        }
        for name, args in calls.items():
            call = Call(tenant="acme", run_id=uuid.uuid4(), effect="e",
                        idempotency_key=f"k-{name}", args=args, credentials=credential_get(connector=name))
            assert "hidden" not in repr(call) and TOKEN not in repr(call)
            connector_get(name).execute(call)
            logging.getLogger("integrations").info("executed %r", call)
        for row in Credential.objects.all():
            assert credential_open(credential=row)
    for secret in (TOKEN, "sk_test_hidden", "sk-hidden"):
        assert secret not in caplog.text
