"""OpenTelemetry: the engine and the ledger make spans through the API (run.advance → step →
effect, with tokens and cost) and record metrics (agentplatform/metrics.py); this module
installs the SDK once per process and carries trace context where no instrumentation does.

Traces: OTEL_EXPORTER_OTLP_ENDPOINT set, spans go to that collector over OTLP/HTTP;
TELEMETRY_SPANS_DIR set (development, tests), each process writes its spans as JSON lines to a
file of its own there. Neither: the API's no-op tracer stays and tracing costs nothing. With a
tracer, Django (server spans), psycopg (a span per statement) and, in Celery workers, Celery
(publish and run spans, context in the task headers) are instrumented by the contrib packages.

Metrics: exported over OTLP with the same endpoint, and kept for Prometheus scrapes when
METRICS_PROMETHEUS (`/metrics` in web processes) or METRICS_WORKER_PORT (a port per worker
process) is set: agentplatform/prometheus.py.

Context across processes: Celery's instrumentation injects the publishing span into the task
headers, but only in processes that registered the task (workers); the doorbell carries it
itself from web processes (`trace_parent`, `trace_attached`), and the ready list keeps the
traceparent of whoever made a run runnable, so the worker's run.advance is a child of the
request that started or resumed the run, whichever process dispatches it later.

Spans are made with `span_start`, never with the API's defaults, which put the exception's raw
message and full stack (platform frames, a DSN in a message) into the span: a failed span gets
the exception's type and redacted message, as status and as its one "exception" event. Spans of
the contrib instrumentations, which use those defaults, are redacted the same way on export
(`SpanRedactor`)."""

import json
import os
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path

from django.conf import settings
from opentelemetry import context, metrics, trace
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import Span, Status, StatusCode, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from agentplatform.redaction import secrets_redact

# What `span_start` gives while no tracer provider is installed: a span that records nothing,
# the current context left as it is.
_UNTRACED = nullcontext(trace.INVALID_SPAN)


def span_start(tracer: Tracer, name: str, *, attributes: dict) -> AbstractContextManager[Span]:
    """`tracer.start_as_current_span`, recording a failure redacted and without a traceback.
    While the process has no tracer provider (none of the settings above), nothing: a step's
    span through the API's no-op tracer was a tenth of the step's CPU (docs/benchmarks.md)."""
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return _UNTRACED
    return _span_started(tracer, name, attributes)


@contextmanager
def _span_started(tracer: Tracer, name: str, attributes: dict) -> Iterator[Span]:
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


# -- context carried by hand ---------------------------------------------------------------------

_w3c = TraceContextTextMapPropagator()


def trace_parent() -> str:
    """The current span as a W3C traceparent, "" when nothing is traced."""
    carrier: dict[str, str] = {}
    _w3c.inject(carrier)
    return carrier.get("traceparent", "")


@contextmanager
def trace_attached(traceparent: str | None) -> Iterator[None]:
    """Make `traceparent` the current context for the block (None: leave the current one;
    "": none, so what starts here is a new trace, not a child of whatever runs now)."""
    if traceparent is None:
        yield
        return
    token = context.attach(_w3c.extract({"traceparent": traceparent}) if traceparent
                           else context.Context())
    try:
        yield
    finally:
        context.detach(token)


# A request's own W3C trace headers: anyone may send them, so by default they are dropped before
# Django's instrumentation reads them. Kept, a caller picks the trace its request joins (another
# tenant's, if it learnt the id), and its sampled flag (off: its work is never traced; on: every
# request of it is, past the operator's sampling ratio). TELEMETRY_TRUST_INCOMING_TRACE keeps
# them, for a deployment whose only callers are its own traced services.
INCOMING_TRACE_HEADERS = ("traceparent", "tracestate", "baggage")
_INCOMING_WSGI = tuple(f"HTTP_{name.upper()}" for name in INCOMING_TRACE_HEADERS)
_INCOMING_ASGI = tuple(name.encode() for name in INCOMING_TRACE_HEADERS)


def incoming_trace_dropped_wsgi(app):
    """The WSGI application, without the request's trace headers (unless trusted)."""
    def application(environ, start_response):
        if not settings.TELEMETRY_TRUST_INCOMING_TRACE:
            for key in _INCOMING_WSGI:
                environ.pop(key, None)
        return app(environ, start_response)
    return application


def incoming_trace_dropped_asgi(app):
    """The ASGI application, without the request's trace headers (unless trusted)."""
    async def application(scope, receive, send):
        if scope.get("type") in ("http", "websocket") and not settings.TELEMETRY_TRUST_INCOMING_TRACE:
            scope = {**scope, "headers": [(name, value) for name, value in scope.get("headers", [])
                                          if name.lower() not in _INCOMING_ASGI]}
        return await app(scope, receive, send)
    return application


# -- export ------------------------------------------------------------------------------------

class SpanRedactor(SpanProcessor):
    """Passes spans on to `inner` with their exception events and status redacted and without
    stack traces: the contrib instrumentations record them with the API's defaults."""

    def __init__(self, inner: SpanProcessor):
        self.inner = inner

    def on_start(self, span, parent_context=None) -> None:
        self.inner.on_start(span, parent_context=parent_context)

    def on_end(self, span: ReadableSpan) -> None:
        self.inner.on_end(span_redacted(span))

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


def span_redacted(span: ReadableSpan) -> ReadableSpan:
    events = [event for event in span.events if event.name == "exception"]
    if not events and not span.status.description:
        return span
    def clean(event):
        if event.name != "exception":
            return event
        attributes = {key: secrets_redact(value) if isinstance(value, str) else value
                      for key, value in (event.attributes or {}).items()
                      if key != "exception.stacktrace"}
        return Event(event.name, attributes, event.timestamp)

    status = span.status
    if status.description:
        status = Status(status.status_code, secrets_redact(status.description))
    return ReadableSpan(
        name=span.name, context=span.context, parent=span.parent, resource=span.resource,
        attributes=span.attributes, events=[clean(e) for e in span.events], links=span.links,
        kind=span.kind, status=status, start_time=span.start_time, end_time=span.end_time,
        instrumentation_scope=span.instrumentation_scope)


class SpanFileExporter(SpanExporter):
    """Spans as JSON lines (development, tests): one file per process, so a test can read what
    a worker process traced."""

    def __init__(self, directory: str):
        Path(directory).mkdir(parents=True, exist_ok=True)
        self.directory, self._lock = directory, threading.Lock()

    def export(self, spans) -> SpanExportResult:
        lines = "".join(json.dumps(json.loads(span.to_json()), separators=(",", ":")) + "\n"
                        for span in spans)
        with self._lock, open(Path(self.directory) / f"spans-{os.getpid()}.jsonl", "a") as out:
            out.write(lines)  # the pid is read per export: a forked pool child has its own
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


# -- setup -------------------------------------------------------------------------------------

_setup_done = False


def telemetry_setup(service: str = "agentplatform") -> None:
    """Install the tracer and meter providers this process's settings ask for, and the contrib
    instrumentations when it traces. Once per process (ready() may run twice)."""
    global _setup_done
    if _setup_done:
        return
    _setup_done = True
    otlp = bool(os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"))
    spans_dir = settings.TELEMETRY_SPANS_DIR
    prometheus = settings.METRICS_PROMETHEUS or bool(settings.METRICS_WORKER_PORT)
    if not (otlp or spans_dir or prometheus):
        return
    from opentelemetry.sdk.resources import Resource

    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", service)})
    if otlp or spans_dir:
        _tracing_setup(resource, otlp=otlp, spans_dir=spans_dir)
    if otlp or prometheus:
        _metrics_setup(resource, otlp=otlp, prometheus=prometheus)


def _tracing_setup(resource, *, otlp: bool, spans_dir: str) -> None:
    from opentelemetry.instrumentation.django import DjangoInstrumentor
    from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    provider = TracerProvider(resource=resource)
    if otlp:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(SpanRedactor(BatchSpanProcessor(OTLPSpanExporter())))
    if spans_dir:  # written as each span ends: a test reads them without waiting for a batch
        provider.add_span_processor(SpanRedactor(SimpleSpanProcessor(SpanFileExporter(spans_dir))))
    trace.set_tracer_provider(provider)
    # Server spans for every request (the parent of what a request enqueues), a span per SQL
    # statement (its text, never its parameters). The stable HTTP conventions label the
    # request metrics by route, not by the Host header a client chooses (bounded cardinality).
    os.environ.setdefault("OTEL_SEMCONV_STABILITY_OPT_IN", "http")
    # probes and scrapes every few seconds are no one's trace
    DjangoInstrumentor().instrument(excluded_urls=os.environ.get(
        "OTEL_PYTHON_DJANGO_EXCLUDED_URLS", r"/(healthz|readyz|metrics)$"))
    PsycopgInstrumentor().instrument(enable_commenter=False)


def celery_instrument() -> None:
    """In a Celery worker (agentplatform/celery.py, worker_init): publish and run spans, the
    publishing span's context in the task headers. Not in web processes: there the tasks are
    not registered, and the instrumentation then leaves its publish span open (the doorbell
    carries the context itself)."""
    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        from opentelemetry.instrumentation.celery import CeleryInstrumentor

        CeleryInstrumentor().instrument()


def _metrics_setup(resource, *, otlp: bool, prometheus: bool) -> None:
    from opentelemetry.sdk.metrics import MeterProvider

    readers = []
    if otlp:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

        readers.append(PeriodicExportingMetricReader(OTLPMetricExporter()))
    if prometheus:  # collected when scraped (agentplatform/prometheus.py)
        from opentelemetry.exporter.prometheus import PrometheusMetricReader

        readers.append(PrometheusMetricReader())
    metrics.set_meter_provider(MeterProvider(resource=resource, metric_readers=readers))
