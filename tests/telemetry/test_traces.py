"""A run explains itself in traces: run.advance → step → effect, with tokens and cost."""

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from integrations.connectors import Connector, connector_register
from integrations.services import credential_set
from runs import engine
from runs.agents import Agent, RetryPolicy, registry
from runs.services import run_start
from tests.support.fakes.fixtures import fake_openai  # noqa: F401
from tests.support.runs import advanced

EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module", autouse=True)
def provider():
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
    trace.set_tracer_provider(provider)  # once per process; the engine's tracers follow it
    yield provider


def test_run_step_and_model_effect_spans_nest_and_carry_tokens(in_acme, fake_openai):  # noqa: F811
    EXPORTER.clear()
    credential_set(connector="model", secrets={"api_key": "sk-test",
                                               "base_url": fake_openai.url + "/v1"})
    run = run_start(agent="worldly", enqueue=False, input={"what": "think"}).run
    assert advanced(run.id) == engine.Outcome.ENDED
    spans = {span.name: span for span in EXPORTER.get_finished_spans()}
    advance, step, effect = spans["run.advance"], spans["step act"], spans["effect model-1"]
    assert advance.attributes["run.id"] == str(run.id) and advance.attributes["tenant"] == "acme"
    assert advance.attributes["outcome"] == "ended"
    assert step.parent.span_id == advance.context.span_id
    assert effect.parent.span_id == step.context.span_id
    assert effect.attributes["connector"] == "model" and effect.attributes["model.tokens"] > 0
    assert step.attributes["transition"] == "Goto" and spans["step after"].attributes["visit"] == 1


# -- a failure's span says what failed, redacted, without the stack ------------------------------

DSN = "postgresql://app:S3cretPW@db.internal/x"


class LeakyConnector(Connector):
    """A receiver whose client library fails with the DSN in its message."""

    name = "leaky-trace"

    def execute(self, call):
        raise RuntimeError(f"cannot reach {call.args['dsn']}")


@pytest.fixture
def leaky():
    connector_register(LeakyConnector())
    agent = Agent("leaky-trace", version=1, retry=RetryPolicy(max_attempts=1))

    @agent.step(start=True)
    def boom(ctx, state):
        if state["via"] == "effect":
            ctx.effect("reach", "leaky-trace", dsn=state["dsn"])
        raise RuntimeError(f"cannot reach {state['dsn']}")

    yield agent
    registry.unregister(agent.name, agent.version)


@pytest.mark.parametrize("via", ["step", "effect"])
def test_a_failed_step_or_effects_span_is_redacted_and_has_no_stack(in_acme, leaky, via):
    EXPORTER.clear()
    run = run_start(agent="leaky-trace", enqueue=False, input={"dsn": DSN, "via": via}).run
    engine.advance(run_id=run.id, sleep=lambda s: None)
    spans = {span.name: span for span in EXPORTER.get_finished_spans()}
    failed = [spans["step boom"]] + ([spans["effect reach"]] if via == "effect" else [])
    for span in failed:
        assert span.status.status_code is StatusCode.ERROR
        assert span.status.description == "RuntimeError: cannot reach postgresql://[redacted]@db.internal/x"
        [event] = span.events
        assert event.name == "exception"
        assert event.attributes["exception.type"] == "RuntimeError"
        assert "exception.stacktrace" not in event.attributes
    text = repr([(s.status.description, [dict(e.attributes) for e in s.events],
                  dict(s.attributes)) for s in spans.values()])
    assert "S3cretPW" not in text
    assert spans["run.advance"].status.status_code is not StatusCode.ERROR
