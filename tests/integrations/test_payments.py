"""The payments connector against a fake Stripe that keeps Stripe's Idempotency-Key promises."""

import json
import threading
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from integrations.connectors import ConnectorError, connector_get

SECRET = "sk_test_acme"


@pytest.fixture
def payments():
    return connector_get("payments")


def creds(fake) -> dict:
    return {"secret_key": SECRET, "api_url": fake.url}


def charge(**overrides) -> dict:
    return {"amount": 2000, "currency": "usd", "source": "tok_visa",
            "metadata": {"order": "42"}, **overrides}


def test_a_charge_is_made_with_the_idempotency_key(payments, fake_stripe, call):
    result = payments.execute(call(charge(), creds(fake_stripe), key="run-1:3:pay"))
    assert result["id"].startswith("ch_") and result["status"] == "succeeded" and result["paid"]
    assert (result["amount"], result["currency"], result["replayed"]) == (2000, "usd", False)
    assert payments.honours_idempotency_key
    assert fake_stripe.charges_by_key() == {"run-1:3:pay": 1}
    assert fake_stripe.charges[0]["metadata"] == {"order": "42"}


def test_the_same_key_and_params_replays_the_stored_charge(payments, fake_stripe, call):
    first = payments.execute(call(charge(), creds(fake_stripe), key="k-replay"))
    again = payments.execute(call(charge(), creds(fake_stripe), key="k-replay"))
    assert again["id"] == first["id"] and again["replayed"] is True
    assert fake_stripe.state()["charges"] == 1


def test_the_same_key_with_other_params_is_an_idempotency_error(payments, fake_stripe, call):
    payments.execute(call(charge(), creds(fake_stripe), key="k-mismatch"))
    with pytest.raises(ConnectorError, match="idempotency_error") as raised:
        payments.execute(call(charge(amount=999), creds(fake_stripe), key="k-mismatch"))
    assert not raised.value.retryable
    assert fake_stripe.state()["charges"] == 1


def test_a_concurrent_request_with_the_same_key_gets_409_and_is_retryable(payments, fake_stripe, call):
    fake_stripe.delay = 0.5  # the first request is still executing when the second arrives
    first = call(charge(), creds(fake_stripe), key="k-concurrent")
    with ThreadPoolExecutor(2) as pool:
        slow = pool.submit(payments.execute, first)
        while not fake_stripe.charges:  # the first one has started executing
            threading.Event().wait(0.01)
        with pytest.raises(ConnectorError, match="409 idempotency_error") as raised:
            payments.execute(first)
        assert raised.value.retryable and not raised.value.sent
        original = slow.result()
    fake_stripe.delay = 0
    assert payments.execute(first)["id"] == original["id"]
    assert fake_stripe.state() | {"charges_by_key": None} == {
        "charges": 1, "charges_failed": 0, "requests": 3, "replays": 1, "conflicts": 1,
        "charges_by_key": None}


def test_a_lost_answer_is_retried_with_the_same_key_and_charges_once(payments, fake_stripe, call):
    fake_stripe.drop_next = 1  # the charge is made; the answer never comes back
    attempt = call(charge(), creds(fake_stripe))
    with pytest.raises(ConnectorError, match="may have been delivered") as raised:
        payments.execute(attempt)
    assert raised.value.retryable and raised.value.sent
    assert payments.execute(attempt)["replayed"] is True
    assert fake_stripe.state()["charges"] == 1


def test_a_declined_card_is_not_retryable_and_is_replayed_as_declined(payments, fake_stripe, call):
    declined = call(charge(source="tok_chargeDeclined"), creds(fake_stripe))
    for _ in range(2):
        with pytest.raises(ConnectorError, match="card_error \\(card_declined\\)") as raised:
            payments.execute(declined)
        assert not raised.value.retryable
    assert fake_stripe.state()["charges_failed"] == 1 and fake_stripe.state()["replays"] == 1


def test_errors_map_to_retryable_or_not(payments, fake_stripe, call):
    fake_stripe.unavailable_next = 1
    with pytest.raises(ConnectorError, match="HTTP 503") as unavailable:
        payments.execute(call(charge(), creds(fake_stripe)))
    assert unavailable.value.retryable
    with pytest.raises(ConnectorError, match="HTTP 401") as unauthorized:
        payments.execute(call(charge(), {"secret_key": "wrong", "api_url": fake_stripe.url}))
    assert not unauthorized.value.retryable
    with pytest.raises(ConnectorError, match="amount") as invalid:
        payments.execute(call(charge(amount=-5), creds(fake_stripe)))
    assert not invalid.value.retryable
    with pytest.raises(ConnectorError, match="cannot connect") as refused:
        payments.execute(call(charge(), {"secret_key": SECRET, "api_url": "http://127.0.0.1:9"}))
    assert refused.value.retryable and not refused.value.sent
    assert fake_stripe.state()["charges"] == 0


def test_invalid_params_are_not_stored_under_the_key(fake_stripe):
    def post(body: bytes):
        request = urllib.request.Request(f"{fake_stripe.url}/v1/charges", data=body, method="POST", headers={
            "Authorization": f"Bearer {SECRET}", "Idempotency-Key": "k-invalid"})
        try:
            with urllib.request.urlopen(request, timeout=5) as answer:
                return answer.status, json.load(answer)
        except urllib.error.HTTPError as error:
            return error.code, json.load(error)

    status, body = post(b"amount=abc&currency=usd&source=tok_visa")
    assert status == 400 and body["error"]["type"] == "invalid_request_error"
    status, body = post(b"amount=100&currency=usd&source=tok_visa")  # the key is still free
    assert status == 200 and body["status"] == "succeeded"
