"""What is counted where it happens, read in this process through an in-memory reader: a lease
taken over, a webhook's receipt, a run's start and end; and contrib spans are redacted."""

import os
import subprocess
import sys
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agentplatform.telemetry import SpanRedactor
from runs.engine import run_claim
from runs.models import Run
from tests.support.api import api_client
from tests.support.runs import finished, start

READER = InMemoryMetricReader()
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", autouse=True)
def meter_provider():
    # once per process; the platform's instruments (proxies until now) follow it
    metrics.set_meter_provider(MeterProvider(metric_readers=[READER]))


def counted(name: str, **labels) -> float:
    data = READER.get_metrics_data()
    total = 0.0
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name != name:
                    continue
                for point in metric.data.data_points:
                    if all(point.attributes.get(k) == v for k, v in labels.items()):
                        total += point.value
    return total


def test_claiming_an_expired_lease_is_a_takeover_and_a_queued_run_is_not(in_acme):
    before = counted("agentplatform.lease.takeovers", of="run")
    run = start("chatter", input={"steps": 1})
    assert run_claim(run_id=run.id, owner="worker-a") is not None  # queued: no takeover
    assert counted("agentplatform.lease.takeovers", of="run") == before
    Run.objects.filter(id=run.id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert run_claim(run_id=run.id, owner="worker-b") is not None  # worker-a's lease expired
    assert counted("agentplatform.lease.takeovers", of="run") == before + 1


def test_a_run_is_counted_started_and_finished_by_status(in_acme):
    started = counted("agentplatform.runs.started")
    succeeded = counted("agentplatform.runs.finished", status="succeeded")
    run = finished(start("chatter", input={"steps": 2}).id)
    assert run.status == "succeeded"
    assert counted("agentplatform.runs.started") == started + 1
    assert counted("agentplatform.runs.finished", status="succeeded") == succeeded + 1


def test_a_webhook_for_no_connection_is_counted_not_found():
    before = counted("agentplatform.webhook.receipts", source="gmail", result="not_found")
    response = api_client(None).post(f"/webhooks/gmail/{uuid.uuid4()}", data=b"{}",
                                     content_type="application/json")
    assert response.status_code == 404
    assert counted("agentplatform.webhook.receipts", source="gmail",
                   result="not_found") == before + 1


def test_a_contrib_spans_exception_is_redacted_and_has_no_stack():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()  # its own: the global one is the trace tests'
    provider.add_span_processor(SpanRedactor(SimpleSpanProcessor(exporter)))
    tracer = provider.get_tracer("contrib-like")
    with pytest.raises(RuntimeError):
        with tracer.start_as_current_span("SELECT"):  # the API's defaults, as contrib uses them
            raise RuntimeError("cannot reach postgresql://app:S3cretPW@db.internal/x")
    [span] = exporter.get_finished_spans()
    [event] = span.events
    assert "exception.stacktrace" not in event.attributes
    assert "S3cretPW" not in repr(dict(event.attributes)) + (span.status.description or "")
    assert "[redacted]" in event.attributes["exception.message"]
    assert span.status.status_code is trace.StatusCode.ERROR


@pytest.mark.parametrize("env, message", [
    ({"METRICS_PROMETHEUS": "1"}, "nobody may scrape"),
    ({"METRICS_WORKER_PORT": "9500"}, "nobody may scrape"),
    ({"METRICS_PROMETHEUS": "1", "METRICS_ALLOWED_NETWORKS": "10.0.0.0/8,intranet"},
     "'intranet' is not a network"),
])
def test_metrics_on_in_production_without_a_token_or_networks_refuse_to_start(env, message):
    environment = {key: value for key, value in os.environ.items()
                   if not key.startswith("METRICS_")}
    environment.update(env, DJANGO_DEBUG="0")
    done = subprocess.run([sys.executable, "-c", "import agentplatform.settings"],
                          env=environment, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and message in done.stderr, done.stderr[-2000:]
