"""The platform's SMTP login is never sent to a tenant's server, and the relay sends as us."""

from uuid import uuid4

from integrations.connectors import Call
from integrations.connectors.base import connector_get
from tests.support.fakes.fixtures import smtp_server  # noqa: F401


def call(args, creds):
    return Call(tenant="acme", run_id=uuid4(), effect="e", idempotency_key=uuid4().hex,
                args=args, credentials=creds)


def test_platform_relay_sends_as_the_platform_with_the_tenants_address_as_reply_to(
        settings, smtp_server):  # noqa: F811
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", smtp_server.port
    settings.DEFAULT_FROM_EMAIL = "noreply@platform.test"
    connector_get("email").execute(call({"to": "a@b.test", "subject": "s", "body": "b",
                                         "from": "ceo@bank.test"}, {}))
    message = smtp_server.messages[-1]
    assert message["From"] == "noreply@platform.test"
    assert message["Reply-To"] == "ceo@bank.test"


def test_the_relay_takes_the_reply_to_from_the_tenants_credential_when_the_call_gives_none(
        settings, smtp_server):  # noqa: F811
    # a definition's email.send tool passes {to, subject, body} only: its credential says who
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", smtp_server.port
    settings.DEFAULT_FROM_EMAIL = "noreply@platform.test"
    connector_get("email").execute(call({"to": "a@b.test", "subject": "s", "body": "b"},
                                        {"from": "invoices@acme.example"}))
    message = smtp_server.messages[-1]
    assert message["From"] == "noreply@platform.test"
    assert message["Reply-To"] == "invoices@acme.example"
