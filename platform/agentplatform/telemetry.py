"""OpenTelemetry: the engine and the ledger make spans through the API (run.advance → step →
effect, with tokens and cost); this module installs the SDK once per process.

OTEL_EXPORTER_OTLP_ENDPOINT set: spans go to that collector over OTLP/HTTP. Otherwise the
API's no-op tracer is left in place and tracing costs nothing."""

import os

from opentelemetry import trace


def telemetry_setup(service: str = "agentplatform") -> None:
    if not os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create(
        {"service.name": os.environ.get("OTEL_SERVICE_NAME", service)}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
