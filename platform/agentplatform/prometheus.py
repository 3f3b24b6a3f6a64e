"""Prometheus scrapes: `/metrics` in web processes (METRICS_PROMETHEUS) and a small HTTP server
per Celery worker process (METRICS_WORKER_PORT), both in the text format, both refused unless
the scraper sends METRICS_TOKEN as a bearer token or comes from METRICS_ALLOWED_NETWORKS.

Each process has its own metrics (a prefork worker's pool processes too), so each serves its
own: pool process i of a prefork worker on METRICS_WORKER_PORT + i, a threads or solo worker on
METRICS_WORKER_PORT. docs/operators.md says how a scraper finds them.
"""

import hmac
import ipaddress
import logging
import threading
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from django.conf import settings
from django.http import Http404, HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

log = logging.getLogger(__name__)


def scrape_allowed(*, authorization: str, address: str, meta=None) -> bool:
    """The bearer token, if one is set and sent; else the client's address, and every address
    the request says it was relayed for (`meta`: the WSGI environ or request.META).

    A reverse proxy in an allowed network relays outsiders' requests from its own address: the
    address it appends to X-Forwarded-For (or X-Real-IP) must be allowed too. A client can only
    add such entries, never remove the proxy's, so spoofing one gets it refused, not let in;
    a `Forwarded` header (RFC 7239) is not parsed: such a request needs the token."""
    token = settings.METRICS_TOKEN
    scheme, _, sent = (authorization or "").partition(" ")
    if token and scheme.lower() == "bearer" and hmac.compare_digest(sent.strip().encode(),
                                                                     token.encode()):
        return True
    meta = meta or {}
    if meta.get("HTTP_FORWARDED"):
        return False
    relayed = [part.strip() for part in meta.get("HTTP_X_FORWARDED_FOR", "").split(",")
               if part.strip()]
    if meta.get("HTTP_X_REAL_IP", "").strip():
        relayed.append(meta["HTTP_X_REAL_IP"].strip())
    return all(_allowed_address(one) for one in (address, *relayed))


def _allowed_address(address: str) -> bool:
    try:
        client = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(client in ipaddress.ip_network(net, strict=False)
               for net in settings.METRICS_ALLOWED_NETWORKS)


@never_cache
@require_GET
def metrics_view(request):
    if not settings.METRICS_PROMETHEUS:
        raise Http404("metrics are off")
    if not scrape_allowed(authorization=request.headers.get("Authorization", ""),
                          address=request.META.get("REMOTE_ADDR", ""), meta=request.META):
        return HttpResponse("Send METRICS_TOKEN as a bearer token.\n", status=401,
                            content_type="text/plain", headers={"WWW-Authenticate": "Bearer"})
    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)


def metrics_app(environ, start_response):
    """The worker's endpoint: the same text and the same rule as `/metrics`."""
    if not scrape_allowed(authorization=environ.get("HTTP_AUTHORIZATION", ""),
                          address=environ.get("REMOTE_ADDR", ""), meta=environ):
        start_response("401 Unauthorized", [("Content-Type", "text/plain"),
                                            ("WWW-Authenticate", "Bearer")])
        return [b"Send METRICS_TOKEN as a bearer token.\n"]
    start_response("200 OK", [("Content-Type", CONTENT_TYPE_LATEST)])
    return [generate_latest(REGISTRY)]


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format, *args):  # a scrape every 15 s is not news
        pass


def worker_metrics_serve(*, offset: int) -> int | None:
    """Serve this process's metrics on METRICS_WORKER_PORT + offset, in a daemon thread.
    Returns the port, or None if off or taken (logged: metrics never stop a worker)."""
    if not settings.METRICS_WORKER_PORT:
        return None
    port = settings.METRICS_WORKER_PORT + offset
    try:
        server = make_server(settings.METRICS_WORKER_ADDR, port, metrics_app,
                             server_class=_Server, handler_class=_QuietHandler)
    except OSError as exc:
        log.warning("metrics: port %s:%s not served: %s", settings.METRICS_WORKER_ADDR, port, exc)
        return None
    threading.Thread(target=server.serve_forever, name=f"metrics:{port}", daemon=True).start()
    log.info("metrics served on %s:%s", settings.METRICS_WORKER_ADDR, port)
    return port
