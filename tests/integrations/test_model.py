"""The model connector against a fake OpenAI-compatible provider: content, usage and cost."""

import pytest

from integrations.connectors import ConnectorError, connector_get
from integrations.connectors.model import cost_usd
from tests.support.fakes import FakeServer

API_KEY = "sk-acme-secret"


@pytest.fixture
def model():
    return connector_get("model")


def creds(fake) -> dict:
    return {"api_key": API_KEY, "base_url": f"{fake.url}/v1"}


def ask(text: str, **extra) -> dict:
    return {"model": "gpt-4o-mini", "messages": [{"role": "system", "content": "be brief"},
                                                  {"role": "user", "content": text}], **extra}


def test_a_completion_returns_content_usage_and_cost(model, fake_openai, call, settings):
    settings.MODEL_PRICES = {"gpt-4o-mini": (0.15, 0.6)}
    result = model.execute(call(ask("three word answer"), creds(fake_openai), key="run-1:1:think"))
    assert result["content"] == "echo: three word answer" and result["finish_reason"] == "stop"
    assert result["usage"] == {"prompt_tokens": 11, "completion_tokens": 4, "total_tokens": 15}
    assert result["cost_usd"] == pytest.approx((11 * 0.15 + 4 * 0.6) / 1000)
    assert result["model"] == "gpt-4o-mini" and result["id"].startswith("chatcmpl-")
    assert fake_openai.state()["requests_by_key"] == {"run-1:1:think": 1}
    assert not model.honours_idempotency_key


def test_max_tokens_and_other_parameters_are_passed_through(model, fake_openai, call):
    result = model.execute(call(ask("a b c d e f", max_tokens=3, temperature=0), creds(fake_openai)))
    assert result["content"] == "echo: a b" and result["finish_reason"] == "length"
    assert result["usage"]["completion_tokens"] == 3


def test_an_unpriced_model_costs_the_default_price(settings):
    settings.MODEL_PRICES, settings.MODEL_PRICE_DEFAULT = {}, (1.0, 2.0)
    assert cost_usd("some-model", 1000, 500) == 2.0


def test_provider_errors_map_to_retryable_or_not(model, fake_openai, call):
    fake_openai.ratelimited_next = 1
    with pytest.raises(ConnectorError, match=r"HTTP 429.*retry after 1s") as limited:
        model.execute(call(ask("x"), creds(fake_openai)))
    assert limited.value.retryable and not limited.value.sent
    fake_openai.failing_next = 1
    with pytest.raises(ConnectorError, match="HTTP 500") as failed:
        model.execute(call(ask("x"), creds(fake_openai)))
    assert failed.value.retryable
    with pytest.raises(ConnectorError, match="HTTP 401") as unauthorized:
        model.execute(call(ask("x"), {**creds(fake_openai), "api_key": "wrong"}))
    assert not unauthorized.value.retryable
    with pytest.raises(ConnectorError, match="does not exist") as unknown:
        model.execute(call({**ask("x"), "model": "unknown-9"}, creds(fake_openai)))
    assert not unknown.value.retryable
    assert fake_openai.state()["requests"] == 0


class NotAModel(FakeServer):
    """A server at the model's base_url that is not a model provider: 200 and a web page."""

    name = "not-a-model"

    def reset(self) -> None:
        pass

    def state(self) -> dict:
        return {}

    status = 200

    def handle(self, method, path, query, headers, raw):
        return self.status, "<html>Sign in to the proxy</html>", {}


def test_an_answer_that_is_not_a_json_object_says_so_and_shows_its_start(model, call):
    server = NotAModel().start()
    try:
        with pytest.raises(ConnectorError, match=r"HTTP 200, but the answer is not a JSON object.*"
                                                 r"is base_url right.*Sign in to the proxy") as raised:
            model.execute(call(ask("x"), {"api_key": API_KEY, "base_url": f"{server.url}/v1"}))
        assert not raised.value.retryable
        server.status = 404  # a web server's page where the API should be
        with pytest.raises(ConnectorError, match=r"HTTP 404: the answer is not a provider's JSON "
                                                 r"error: '\"<html>Sign in"):
            model.execute(call(ask("x"), {"api_key": API_KEY, "base_url": f"{server.url}/v1"}))
    finally:
        server.stop()
