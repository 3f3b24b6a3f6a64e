"""The webhook connector: signed JSON with an Idempotency-Key, against a receiver that acts once
per key."""

import time

import pytest

from integrations.connectors import ConnectorError, connector_get
from integrations.connectors.webhook import SIGNATURE_HEADER, signature, signature_verify

SECRET = "whsec_test"


@pytest.fixture
def webhook():
    return connector_get("webhook")


def creds(fake) -> dict:
    return {"signing_secret": SECRET, "url": f"{fake.url}/hooks/agent"}


def test_a_delivery_is_signed_and_carries_the_key(webhook, fake_webhook, call):
    result = webhook.execute(call({"payload": {"order": 42}, "event": "order.paid"}, creds(fake_webhook),
                                  key="run-1:4:hook"))
    assert result == {"status": 200, "body": {"received": True, "duplicate": False}}
    [delivery] = fake_webhook.deliveries
    assert delivery["path"] == "/hooks/agent" and delivery["key"] == "run-1:4:hook"
    assert delivery["body"] == b'{"order":42}'
    assert delivery["headers"]["X-Agentplatform-Event"] == "order.paid"
    header = delivery["headers"][SIGNATURE_HEADER]
    assert header.startswith("t=") and ",v1=" in header
    assert signature_verify(SECRET, header, delivery["body"])
    assert not signature_verify("another-secret", header, delivery["body"])
    assert not signature_verify(SECRET, header, b'{"order":43}')
    assert webhook.honours_idempotency_key


def test_signatures_expire(webhook):
    old = int(time.time()) - 3600
    assert not signature_verify(SECRET, signature(SECRET, old, b"{}"), b"{}")


def test_an_answer_lost_after_delivery_is_retried_and_acted_on_once(webhook, fake_webhook, call):
    fake_webhook.drop_next = 1
    attempt = call({"payload": {"n": 1}}, creds(fake_webhook))
    with pytest.raises(ConnectorError) as raised:
        webhook.execute(attempt)
    assert raised.value.retryable and raised.value.sent
    assert webhook.execute(attempt)["body"]["duplicate"] is True
    assert len(fake_webhook.events) == 1 and len(fake_webhook.deliveries) == 2


def test_receiver_errors_map_to_retryable_or_not(webhook, fake_webhook, call):
    fake_webhook.failing_next = 1
    with pytest.raises(ConnectorError, match="HTTP 500") as failed:
        webhook.execute(call({"payload": {}}, creds(fake_webhook)))
    assert failed.value.retryable and failed.value.sent
    with pytest.raises(ConnectorError, match="HTTP 401") as rejected:
        webhook.execute(call({"payload": {}}, {**creds(fake_webhook), "signing_secret": "wrong"}))
    assert not rejected.value.retryable
    with pytest.raises(ConnectorError, match="cannot connect") as refused:
        webhook.execute(call({"payload": {}, "url": "http://127.0.0.1:9/"}, {"signing_secret": SECRET}))
    assert refused.value.retryable and not refused.value.sent
    with pytest.raises(ConnectorError, match="signing_secret"):
        webhook.execute(call({"payload": {}, "url": fake_webhook.url}))
    assert fake_webhook.events == {}


def test_a_receiver_that_never_answers_times_out_as_maybe_delivered(webhook, fake_webhook, call, settings):
    settings.CONNECTOR_TIMEOUT_SECONDS = 0.3
    import socket

    with socket.socket() as silent:  # accepts the connection, reads nothing, answers nothing
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/"
        with pytest.raises(ConnectorError, match="timed out") as raised:
            webhook.execute(call({"payload": {}, "url": url}, {"signing_secret": SECRET}))
    assert raised.value.retryable and raised.value.sent


# -- what cannot be sent is refused before connecting, never quoted, and marked not sent -------

@pytest.mark.parametrize("path", ["/hook?token=SUPERSECRET1234 x", 
                                  "/h\u00e9?token=SUPERSECRET1234", "/hook?token=SUPERSECRET1234\x7f"])
def test_a_url_that_cannot_be_sent_is_refused_unsent_without_quoting_it(webhook, fake_webhook,
                                                                         call, path):
    with pytest.raises(ConnectorError, match="cannot send this request") as refused:
        webhook.execute(call({"payload": {}}, {"signing_secret": SECRET,
                                               "url": f"{fake_webhook.url}{path}"}))
    assert "SUPERSECRET1234" not in str(refused.value)
    assert refused.value.sent is False and refused.value.retryable is False
    assert fake_webhook.deliveries == []


@pytest.mark.parametrize("event", ["paid\r\nX-Injected: 1", "paid\nX-Injected: 1", "pay\u2603",
                                   "paid\x00"])
def test_an_event_that_cannot_be_a_header_is_refused_unsent(webhook, fake_webhook, call, event):
    with pytest.raises(ConnectorError, match="X-Agentplatform-Event header") as refused:
        webhook.execute(call({"payload": {}, "event": event}, creds(fake_webhook)))
    assert refused.value.sent is False and refused.value.retryable is False
    assert fake_webhook.deliveries == []


@pytest.mark.parametrize("url", ["https://user:pa'ssw0rd@hooks.ssrf.test:99999/",
                                 "https://user:pa ssw0rd@hooks.ssrf.test:99999/",
                                 "https://user:pa<ssw0rd@hooks.ssrf.test:x/",
                                 "https://user:pa\"ssw0rd@[::1/"])
def test_a_malformed_url_is_refused_without_echoing_it(webhook, call, url):
    with pytest.raises(ConnectorError, match="not http") as refused:
        webhook.execute(call({"payload": {}, "url": url}, {"signing_secret": SECRET}))
    assert "ssw0rd" not in str(refused.value) and "user" not in str(refused.value)
    assert refused.value.sent is False and refused.value.retryable is False
