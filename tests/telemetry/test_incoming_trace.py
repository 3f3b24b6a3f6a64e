"""A caller's own W3C trace headers are dropped at the WSGI/ASGI entry, before Django's
instrumentation reads them: a caller does not choose the trace its request joins, nor whether it
is sampled (TELEMETRY_TRUST_INCOMING_TRACE keeps them)."""

import asyncio

from django.test import override_settings

from agentplatform.telemetry import incoming_trace_dropped_asgi, incoming_trace_dropped_wsgi


def test_a_callers_own_trace_headers_are_dropped_unless_trusted():
    seen = {}
    wsgi = incoming_trace_dropped_wsgi(lambda environ, start: seen.update(environ) or [])
    sent = {"HTTP_TRACEPARENT": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "HTTP_TRACESTATE": "a=b", "HTTP_BAGGAGE": "tenant=acme", "HTTP_X_OTHER": "kept"}
    wsgi(dict(sent), None)
    assert "HTTP_TRACEPARENT" not in seen and "HTTP_TRACESTATE" not in seen
    assert "HTTP_BAGGAGE" not in seen and seen["HTTP_X_OTHER"] == "kept"
    with override_settings(TELEMETRY_TRUST_INCOMING_TRACE=True):
        wsgi(dict(sent), None)
        assert seen["HTTP_TRACEPARENT"] == sent["HTTP_TRACEPARENT"]

    async def inner(scope, receive, send):
        seen["asgi"] = [name for name, _ in scope["headers"]]

    asgi = incoming_trace_dropped_asgi(inner)
    asyncio.run(asgi({"type": "http", "headers": [(b"traceparent", b"00-x"), (b"Baggage", b"y"),
                                                 (b"accept", b"*/*")]}, None, None))
    assert seen["asgi"] == [b"accept"]
