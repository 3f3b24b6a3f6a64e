"""A run explains itself in traces: run.advance → step → effect, with tokens and cost."""

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from integrations.services import credential_set
from runs import engine
from runs.services import run_start
from tests.support.fakes.fixtures import fake_openai  # noqa: F401

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
    assert engine.advance(run_id=run.id) == engine.Outcome.ENDED
    spans = {span.name: span for span in EXPORTER.get_finished_spans()}
    advance, step, effect = spans["run.advance"], spans["step act"], spans["effect model-1"]
    assert advance.attributes["run.id"] == str(run.id) and advance.attributes["tenant"] == "acme"
    assert advance.attributes["outcome"] == "ended"
    assert step.parent.span_id == advance.context.span_id
    assert effect.parent.span_id == step.context.span_id
    assert effect.attributes["connector"] == "model" and effect.attributes["model.tokens"] > 0
    assert step.attributes["transition"] == "Goto" and spans["step after"].attributes["visit"] == 1
