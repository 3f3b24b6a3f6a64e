"""The email connector against a real SMTP server (aiosmtpd) on loopback."""

import pytest

from integrations.connectors import ConnectorError, Lookup, connector_get
from integrations.connectors.email import message_id_for


@pytest.fixture
def email():
    return connector_get("email")


def creds(server) -> dict:
    return {"host": server.host, "port": server.port, "from": "agents@acme.test"}


def test_a_message_is_sent_carrying_the_key(email, smtp_server, call):
    result = email.execute(call({"to": "ops@acme.test", "subject": "Report", "body": "All green."},
                                creds(smtp_server), key="run-1:2:mail"))
    assert result == {"message_id": message_id_for("run-1:2:mail"), "recipients": ["ops@acme.test"]}
    [message] = smtp_server.messages
    assert message["Subject"] == "Report" and message["From"] == "agents@acme.test"
    assert message["X-Idempotency-Key"] == "run-1:2:mail"
    assert message["Message-ID"] == message_id_for("run-1:2:mail")
    assert message.get_content().strip() == "All green."
    assert not email.honours_idempotency_key


def test_a_resend_is_recognisable_as_the_same_message(email, smtp_server, call):
    attempt = call({"to": ["a@acme.test", "b@acme.test"], "subject": "Hi", "body": "x",
                    "from": "bot@acme.test"}, creds(smtp_server))
    email.execute(attempt)
    email.execute(attempt)
    first, second = smtp_server.messages
    assert first["Message-ID"] == second["Message-ID"] and first["From"] == "bot@acme.test"
    assert smtp_server.inbox.envelopes[0][1] == ["a@acme.test", "b@acme.test"]


def test_smtp_cannot_be_asked_so_lookup_is_unknown(email, call):
    assert email.lookup(call({"to": "x@acme.test", "subject": "s", "body": "b"})) is Lookup.UNKNOWN


def test_smtp_errors_map_to_retryable_or_not(email, smtp_server, call):
    smtp_server.inbox.reject_next = 1
    with pytest.raises(ConnectorError, match="451") as deferred:
        email.execute(call({"to": "ops@acme.test", "subject": "s", "body": "b"}, creds(smtp_server)))
    assert deferred.value.retryable and not deferred.value.sent
    with pytest.raises(ConnectorError, match="cannot open an SMTP session") as refused:
        email.execute(call({"to": "ops@acme.test", "subject": "s", "body": "b"},
                           {"host": "127.0.0.1", "port": 9}))
    assert refused.value.retryable and not refused.value.sent
    with pytest.raises(ConnectorError, match="'to'") as invalid:
        email.execute(call({"to": "", "subject": "s", "body": "b"}, creds(smtp_server)))
    assert not invalid.value.retryable
    assert smtp_server.messages == []
