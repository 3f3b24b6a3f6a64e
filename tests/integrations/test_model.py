"""The model connector against a fake OpenAI-compatible provider: content, usage and cost."""

import http.server
import json
import threading

import pytest

from agentplatform.storable import json_shape, json_storable
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


@pytest.fixture
def hostile_provider():
    """A provider on loopback that answers every request with `answer.body` (a hostile one)."""

    class Answer:
        body: dict = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            raw = json.dumps(Answer.body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    Answer.url = f"http://127.0.0.1:{server.server_address[1]}"
    yield Answer
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("api_format, usage", [
    ("openai", {"prompt_tokens": -10 ** 9, "completion_tokens": -5, "total_tokens": -10 ** 9}),
    ("openai", {"prompt_tokens": 10 ** 30, "completion_tokens": 1, "total_tokens": 10 ** 30}),
    ("anthropic", {"input_tokens": -10 ** 9, "output_tokens": -5}),
    ("anthropic", {"input_tokens": 10 ** 30, "output_tokens": 1}),
])
def test_a_provider_cannot_lower_or_overflow_what_a_run_spent(model, hostile_provider, call,
                                                              api_format, usage):
    """Usage is the provider's word: a negative count would give a run budget back, one past a
    bigint would fail the ledger's write after the turn was paid for."""
    hostile_provider.body = {"choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}],
                             "usage": usage} if api_format == "openai" else \
        {"id": "msg_1", "type": "message", "role": "assistant", "model": "m", "stop_reason": "end_turn",
         "content": [{"type": "text", "text": "hi"}], "usage": usage}
    result = model.execute(call(ask("x"), {"api_key": API_KEY, "api_format": api_format,
                                           "base_url": hostile_provider.url + "/v1"}))
    counts = result["usage"]
    assert all(0 <= count < 2 ** 62 for count in counts.values()), counts  # a bigint column's
    assert counts["total_tokens"] >= counts["prompt_tokens"] + counts["completion_tokens"]
    assert 0 <= result["cost_usd"]


@pytest.mark.parametrize("content, stored", [("a\x00b", "a\ufffdb"), ("\ud800", "\ufffd"),
                                             (float("nan"), "nan"), (float("inf"), "inf")])
def test_an_answer_jsonb_cannot_store_is_recorded_as_it_can(model, hostile_provider, call, content,
                                                            stored):
    """json.loads reads U+0000, lone surrogates, NaN and Infinity; PostgreSQL's jsonb does not:
    kept as they came, they failed the ledger's write after the turn was paid for, and each
    retry paid again. The ledger records what jsonb can hold (and the step reads that)."""
    hostile_provider.body = {"id": content, "usage": {"prompt_tokens": 1, "completion_tokens": 1},
                             "choices": [{"message": {"content": content}, "finish_reason": "stop"}]}
    result = model.execute(call(ask("x"), {"api_key": API_KEY, "base_url": hostile_provider.url + "/v1"}))
    recorded = json_storable(result)
    assert json_shape(recorded)[1] is None
    assert (recorded["id"], recorded["content"]) == (stored, stored)


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
