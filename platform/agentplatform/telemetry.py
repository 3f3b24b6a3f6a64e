"""OpenTelemetry: the engine and the ledger make spans through the API (run.advance → step →
effect, with tokens and cost); this module installs the SDK once per process.

OTEL_EXPORTER_OTLP_ENDPOINT set: spans go to that collector over OTLP/HTTP. Otherwise the
API's no-op tracer is left in place and tracing costs nothing.

Spans are made with `span_start`, never with the API's defaults, which put the exception's raw
message and full stack (platform frames, a DSN in a message) into the span: a failed span gets
the exception's type and redacted message, as status and as its one "exception" event."""

import os
from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry import trace
from opentelemetry.trace import Span, Status, StatusCode, Tracer

from agentplatform.redaction import secrets_redact


@contextmanager
def span_start(tracer: Tracer, name: str, *, attributes: dict) -> Iterator[Span]:
    """`tracer.start_as_current_span`, recording a failure redacted and without a traceback."""
    with tracer.start_as_current_span(name, attributes=attributes, record_exception=False,
                                      set_status_on_exception=False) as span:
        try:
            yield span
        except Exception as exc:
            span_failed(span, exc)
            raise


def span_failed(span: Span, exc: BaseException) -> None:
    message = secrets_redact(str(exc))
    span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {message}"))
    span.add_event("exception", {"exception.type": type(exc).__name__,
                                 "exception.message": message, "exception.escaped": True})


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
