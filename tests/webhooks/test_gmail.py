"""Gmail push (Cloud Pub/Sub with OIDC): only Google-signed tokens for this connection count;
a valid push resumes the gate keyed on the mailbox, once per messageId."""

import uuid

import pytest
from django.test import Client
from django_tenants.utils import tenant_context

from integrations.webhooks.models import GmailMessageSeen
from integrations.webhooks.services import gmail_connection_create
from runs.approvals.models import InboundEvent
from runs.models import RunEvent
from tests.support.api import start, status_of
from tests.webhooks.google import Signer, push_body

SERVICE_ACCOUNT = "gmail-push@acme-project.iam.gserviceaccount.com"
GOOGLE = Signer()


@pytest.fixture(autouse=True)
def trusted_google_keys(settings):
    settings.GOOGLE_OIDC_JWKS = GOOGLE.jwks()
    settings.GOOGLE_OIDC_CERTS_URL = "http://127.0.0.1:9/never-fetched"


@pytest.fixture
def mailbox(acme):
    address = f"hr-{uuid.uuid4().hex[:8]}@acme.test"
    return gmail_connection_create(tenant=acme, email=address,
                                   audience=f"https://hooks.acme.test/{uuid.uuid4()}",
                                   service_account_email=SERVICE_ACCOUNT)


def push(connection, body, token):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}
    return Client().post(f"/webhooks/gmail/{connection.id}", body,
                         content_type="application/json", **headers)


def good_token(connection, **overrides):
    return GOOGLE.token(**{"audience": connection.audience, "email": SERVICE_ACCOUNT, **overrides})


def test_valid_push_resumes_the_gate_keyed_on_the_mailbox_once(acme, acme_api, mailbox, worker):
    run_id = start(acme_api, how="event", kind="gmail", key=mailbox.email)
    status_of(acme_api, run_id, "waiting")
    message_id = str(uuid.uuid4().int)[:16]
    body = push_body(mailbox.email, message_id, history_id=4242)
    assert push(mailbox, body, good_token(mailbox)).status_code == 204
    assert push(mailbox, body, good_token(mailbox)).status_code == 204  # at-least-once redelivery
    done = status_of(acme_api, run_id, "succeeded")
    assert done["result"] == {"historyId": 4242, "messageId": message_id}
    with tenant_context(acme):
        assert RunEvent.objects.filter(run_id=run_id, kind="event_received").count() == 1
        assert InboundEvent.objects.filter(source_id=f"gmail:{message_id}").count() == 1
    assert GmailMessageSeen.objects.filter(message_id=message_id).count() == 1


def test_issuer_without_scheme_is_accepted(mailbox, worker):
    token = good_token(mailbox, issuer="accounts.google.com")
    assert push(mailbox, push_body(mailbox.email, uuid.uuid4().hex), token).status_code == 204


@pytest.mark.parametrize("case", ["wrong_key", "expired", "wrong_audience", "wrong_issuer",
                                  "wrong_email", "unverified_email", "unknown_kid", "garbage",
                                  "missing"])
def test_bad_tokens_are_rejected_and_record_nothing(acme, mailbox, case):
    intruder = Signer(kid=GOOGLE.kid)  # same kid, another key: a forged signature
    token = {
        "wrong_key": lambda: intruder.token(audience=mailbox.audience, email=SERVICE_ACCOUNT),
        "expired": lambda: good_token(mailbox, expires_in=-120),
        "wrong_audience": lambda: good_token(mailbox, audience="https://elsewhere.test/"),
        "wrong_issuer": lambda: good_token(mailbox, issuer="https://evil.example"),
        "wrong_email": lambda: good_token(mailbox, email="someone@evil.iam.gserviceaccount.com"),
        "unverified_email": lambda: good_token(mailbox, email_verified=False),
        "unknown_kid": lambda: good_token(mailbox, kid="rotated-away"),
        "garbage": lambda: "not.a.jwt",
        "missing": lambda: None,
    }[case]()
    message_id = uuid.uuid4().hex
    response = push(mailbox, push_body(mailbox.email, message_id), token)
    assert response.status_code in (401, 403), response.content
    assert response.json()["error"]["code"]
    assert not GmailMessageSeen.objects.filter(message_id=message_id).exists()
    with tenant_context(acme):
        assert not InboundEvent.objects.filter(source_id=f"gmail:{message_id}").exists()


def test_malformed_bodies_are_400(mailbox):
    for body in (b"not json", b"[]", b'{"message": {"messageId": "1", "data": "!!notbase64"}}',
                 b'{"message": {"messageId": "1", "data": "eyJ4IjogMX0="}}',  # {"x": 1}
                 push_body(mailbox.email, "")):
        response = push(mailbox, body, good_token(mailbox))
        assert response.status_code == 400, body
        assert response.json()["error"]["code"] == "malformed_body"


def test_push_for_another_mailbox_is_refused(mailbox):
    response = push(mailbox, push_body("ceo@acme.test", uuid.uuid4().hex), good_token(mailbox))
    assert response.status_code == 403 and response.json()["error"]["code"] == "wrong_mailbox"


def test_unknown_connection_is_404(mailbox):
    response = Client().post(f"/webhooks/gmail/{uuid.uuid4()}", b"{}",
                             content_type="application/json")
    assert response.status_code == 404
