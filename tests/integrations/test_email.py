"""The email connector against a real SMTP server (aiosmtpd) on loopback."""

import socket
import threading

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult

from integrations.connectors import ConnectorError, Lookup, connector_get
from integrations.connectors.email import message_id_for
from tests.support.fakes.smtp import Inbox, free_port


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


@pytest.mark.parametrize("args", [
    {"subject": "Report\r\nBcc: everyone@globex.test"},
    {"to": "ops@acme.test\r\nBcc: everyone@globex.test"},
    {"from": "agents@acme.test\nBcc: everyone@globex.test"},
    {"to": "not an address@@acme.test"},
])
def test_a_header_that_cannot_be_sent_is_refused_before_the_session(email, smtp_server, call,
                                                                    args):
    message = {"to": "ops@acme.test", "subject": "s", "body": "b", **args}
    with pytest.raises(ConnectorError, match="line break or is not a valid address") as refused:
        email.execute(call(message, creds(smtp_server)))
    assert not refused.value.retryable and not refused.value.sent
    assert smtp_server.messages == []


# -- a tenant's server never gets the platform relay's login or client certificate -------------

@pytest.fixture
def logins():
    """An SMTP server on loopback that offers AUTH and records every login it is given: the
    tenant's server, run by whoever set the credential."""
    seen: list[tuple[bytes, bytes]] = []

    def authenticator(server, session, envelope, mechanism, auth_data):
        seen.append((auth_data.login, auth_data.password))
        return AuthResult(success=True)

    controller = Controller(Inbox(), hostname="127.0.0.1", port=free_port(),
                            authenticator=authenticator, auth_require_tls=False)
    controller.start()
    yield controller.port, seen
    controller.stop()


@pytest.mark.parametrize("login", [{"username": None, "password": None},
                                   {"username": None}, {"password": None}])
def test_a_tenant_server_with_a_null_login_never_gets_the_relays_login(email, settings, logins,
                                                                       call, login):
    settings.EMAIL_HOST_USER, settings.EMAIL_HOST_PASSWORD = "relay-user", "relay-password"
    port, seen = logins
    with pytest.raises(ConnectorError, match="must be a string") as refused:
        email.execute(call({"to": "ops@acme.test", "subject": "s", "body": "b"},
                           {"host": "127.0.0.1", "port": port, **login}))
    assert not refused.value.retryable and not refused.value.sent
    assert seen == []


def test_a_tenant_server_gets_the_tenants_login_or_none(email, settings, logins, call):
    settings.EMAIL_HOST_USER, settings.EMAIL_HOST_PASSWORD = "relay-user", "relay-password"
    port, seen = logins
    message = {"to": "ops@acme.test", "subject": "s", "body": "b"}
    email.execute(call(message, {"host": "127.0.0.1", "port": port}))
    email.execute(call(message, {"host": "127.0.0.1", "port": port, "username": "acme",
                                 "password": "acme-pw"}))
    assert seen == [(b"acme", b"acme-pw")]


@pytest.mark.parametrize("field, value", [("use_tls", "false"), ("use_ssl", 1), ("port", True),
                                          ("port", "25x"), ("host", ["127.0.0.1"])])
def test_a_tenant_credential_of_the_wrong_shape_is_refused_before_connecting(
        email, logins, call, field, value):
    port, seen = logins
    with pytest.raises(ConnectorError, match="credential is invalid") as refused:
        email.execute(call({"to": "ops@acme.test", "subject": "s", "body": "b"},
                           {"host": "127.0.0.1", "port": port, field: value}))
    assert not refused.value.retryable and not refused.value.sent


def test_a_tenant_server_is_not_shown_the_relays_client_certificate(email, settings, call):
    # the relay's certificate files do not exist: a client that loads them fails with
    # FileNotFoundError before any TLS; one that does not gets to the (refused) handshake
    settings.EMAIL_SSL_CERTFILE = "/nonexistent/relay-client.crt"
    settings.EMAIL_SSL_KEYFILE = "/nonexistent/relay-client.key"
    listener = socket.create_server(("127.0.0.1", 0))
    threading.Thread(target=lambda: listener.accept()[0].close(), daemon=True).start()
    try:
        with pytest.raises(ConnectorError, match="cannot open an SMTP session") as failed:
            email.execute(call({"to": "ops@acme.test", "subject": "s", "body": "b"},
                               {"host": "127.0.0.1", "port": listener.getsockname()[1],
                                "use_ssl": True}))
    finally:
        listener.close()
    assert "FileNotFoundError" not in str(failed.value)
