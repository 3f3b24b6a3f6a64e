"""One HTTP exchange with an explicit timeout, telling apart "never sent" from "maybe delivered".

Built on http.client rather than urllib so a failure to connect (the receiver saw nothing: safe
to send again) is distinguishable from a failure after the request went out (it may have acted).
Nothing here logs; headers carry secrets.
"""

import http.client
import ipaddress
import json
import socket
import ssl
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings

from .base import ConnectorError

RESPONSE_MAX_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class Response:
    status: int
    headers: dict[str, str]  # lower-cased names
    body: bytes

    def json(self) -> Any:
        try:
            return json.loads(self.body or b"null")
        except ValueError:
            return None

    def retry_after(self) -> str:
        value = self.headers.get("retry-after", "")
        return f" (retry after {value}s)" if value else ""


def operator_hosts() -> set[str]:
    """Hosts the operator configured (settings); tenants' URLs get no such trust."""
    urls = (settings.SLACK_API_URL, settings.STRIPE_API_URL, settings.OPENAI_BASE_URL)
    return {urlsplit(u).hostname for u in urls if u} | {settings.EMAIL_HOST}


def destination_check(host: str, *, receiver: str) -> None:
    """Refuse a tenant-supplied destination inside our networks (loopback, private, link-local,
    metadata...): workers must not become a tenant's way into them (SSRF)."""
    if settings.CONNECTOR_ALLOW_PRIVATE_DESTINATIONS or host in operator_hosts():
        return
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except OSError:
        return  # unresolvable: connecting fails on its own, with sent=False
    for address in addresses:
        ip = ipaddress.ip_address(address.split("%")[0])
        if getattr(ip, "ipv4_mapped", None):
            ip = ip.ipv4_mapped
        if not ip.is_global or ip.is_multicast:
            raise ConnectorError(f"{receiver}: {host} resolves to a non-public address; "
                                 "refused", retryable=False)


def request(method: str, url: str, *, headers: dict[str, str], body: bytes | None = None,
            timeout: float | None = None, receiver: str) -> Response:
    """Send one request. Raises ConnectorError(retryable=True) on transport failures, with
    `sent=False` only when the connection was never made."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConnectorError(f"{receiver}: {url!r} is not an http(s) URL", retryable=False)
    destination_check(parts.hostname, receiver=receiver)
    timeout = settings.CONNECTOR_TIMEOUT_SECONDS if timeout is None else timeout
    if parts.scheme == "https":
        conn = http.client.HTTPSConnection(parts.hostname, parts.port, timeout=timeout,
                                           context=ssl.create_default_context())
    else:
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    where = f"{parts.scheme}://{parts.netloc}{parts.path}"  # never the query: it may hold tokens
    try:
        try:
            conn.connect()
        except (OSError, ssl.SSLError) as exc:
            raise ConnectorError(f"{receiver}: cannot connect to {where}: {_reason(exc)}",
                                 retryable=True, sent=False) from None
        try:
            conn.request(method, target, body=body, headers=headers)
            answer = conn.getresponse()
            data = answer.read(RESPONSE_MAX_BYTES + 1)
        except (OSError, http.client.HTTPException) as exc:
            raise ConnectorError(
                f"{receiver}: no complete answer from {where} ({_reason(exc)}); the request may "
                "have been delivered", retryable=True, sent=True) from None
    finally:
        conn.close()
    if len(data) > RESPONSE_MAX_BYTES:
        raise ConnectorError(f"{receiver}: the answer from {where} is larger than "
                             f"{RESPONSE_MAX_BYTES} bytes", retryable=False, sent=True)
    return Response(answer.status, {k.lower(): v for k, v in answer.getheaders()}, data)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, socket.timeout | TimeoutError):
        return "timed out"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
