"""One HTTP exchange with an explicit timeout, telling apart "never sent" from "maybe delivered";
and the SSRF guard every connector's destination passes (`destination_resolve`).

Built on http.client rather than urllib so a failure to connect (the receiver saw nothing: safe
to send again) is distinguishable from a failure after the request went out (it may have acted).
A destination's name is resolved once (`resolve`), every address it resolves to is checked, and
the connection goes to a checked address while Host and TLS SNI keep the name: a second lookup
(DNS rebinding) never happens. Nothing here logs; headers carry secrets.
"""

import http.client
import ipaddress
import json
import socket
import ssl
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings

from agentplatform.redaction import secrets_redact

from .base import ConnectorError

RESPONSE_MAX_BYTES = 4 * 1024 * 1024
DEFAULT_PORTS = {"http": 80, "https": 443}
NAT64 = ipaddress.ip_network("64:ff9b::/96")


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


@dataclass(frozen=True)
class Destination:
    """A destination whose name was resolved once and checked: connect to `addresses` only."""

    host: str  # the name: Host header, TLS server_hostname, error texts
    port: int
    addresses: tuple[tuple[int, str], ...]  # (family, address), in the resolver's order

    def connect(self, timeout: float | None) -> socket.socket:
        """A TCP connection to the first checked address that answers; never to the name."""
        error: OSError = OSError(f"{self.host} has no address")
        for family, address in self.addresses:
            sock = socket.socket(family, socket.SOCK_STREAM)
            try:
                sock.settimeout(timeout)
                sock.connect((address, self.port))
                return sock
            except OSError as exc:
                sock.close()
                error = exc
        raise error


def resolve(host: str, port: int) -> list[tuple[int, str]]:
    """The one DNS lookup of a destination: its (family, address) pairs."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [(family, sockaddr[0].split("%")[0]) for family, _, _, _, sockaddr in infos]


def address_refusal(address: str) -> str:
    """Why a connector may not connect to `address` for a tenant ("" if it may): anything not
    globally routable, and IPv6 forms that carry an IPv4 address inside (mapped, 6to4, NAT64,
    Teredo) when the carried one is not."""
    ip = ipaddress.ip_address(address)
    if not ip.is_global or ip.is_multicast or ip.is_reserved or ip.is_unspecified:
        return f"{ip} is not a public address"
    if isinstance(ip, ipaddress.IPv6Address):
        carried = [ip.ipv4_mapped, ip.sixtofour, ip.teredo[1] if ip.teredo else None,
                   ipaddress.IPv4Address(ip.packed[-4:]) if ip in NAT64 else None]
        for inner in filter(None, carried):
            if not inner.is_global or inner.is_multicast or inner.is_reserved:
                return f"{ip} carries {inner}, which is not a public address"
    return ""


def destination_resolve(host: str, port: int, *, receiver: str, ports: Iterable[int],
                        operator: bool = False) -> Destination:
    """Resolve `host` once and return what may be connected to. `operator`: the destination
    comes from settings (the operator's own relay or API), so private addresses and any port are
    fine; a tenant-supplied one must use one of `ports` and resolve only to public addresses.
    Fails closed: a name that does not resolve is refused (retryable, nothing was sent)."""
    trusted = operator or settings.CONNECTOR_ALLOW_PRIVATE_DESTINATIONS
    if not trusted and port not in set(ports):
        raise ConnectorError(f"{receiver}: port {port} is not allowed for {host} (allowed: "
                             f"{', '.join(map(str, sorted(set(ports))))})", retryable=False)
    try:
        addresses = resolve(host, port)
    except (OSError, UnicodeError) as exc:
        raise ConnectorError(f"{receiver}: {host} does not resolve ({_reason(exc)}); refused",
                             retryable=True, sent=False) from None
    if not addresses:
        raise ConnectorError(f"{receiver}: {host} does not resolve; refused", retryable=True,
                             sent=False)
    if not trusted:
        for _, address in addresses:
            why = address_refusal(address)
            if why:
                raise ConnectorError(f"{receiver}: {host} resolves to a non-public address "
                                     f"({why}); refused", retryable=False)
    return Destination(host=host, port=port, addresses=tuple(addresses))


class _PinnedHTTPConnection(http.client.HTTPConnection):
    """http.client with the socket made to a checked address; Host stays the name."""

    def __init__(self, destination: Destination, **kwargs):
        super().__init__(destination.host, destination.port, **kwargs)
        self._create_connection = lambda _address, timeout, _source: destination.connect(timeout)


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    """The same over TLS: the certificate is checked against the name (SNI = the name)."""

    def __init__(self, destination: Destination, **kwargs):
        super().__init__(destination.host, destination.port, **kwargs)
        self._create_connection = lambda _address, timeout, _source: destination.connect(timeout)


def request(method: str, url: str, *, headers: dict[str, str], body: bytes | None = None,
            timeout: float | None = None, receiver: str, operator: bool = False) -> Response:
    """Send one request. Raises ConnectorError(retryable=True) on transport failures, with
    `sent=False` only when the connection was never made. `operator`: the URL comes from
    settings, not from a tenant (see destination_resolve)."""
    try:
        parts = urlsplit(url)
        port = parts.port or DEFAULT_PORTS.get(parts.scheme)
    except ValueError:
        parts, port = None, None
    if parts is None or parts.scheme not in DEFAULT_PORTS or not parts.hostname or port is None:
        raise ConnectorError(f"{receiver}: {secrets_redact(repr(url))} is not an http(s) URL",
                             retryable=False)
    destination = destination_resolve(parts.hostname, port, receiver=receiver,
                                      ports=settings.CONNECTOR_HTTP_PORTS, operator=operator)
    timeout = settings.CONNECTOR_TIMEOUT_SECONDS if timeout is None else timeout
    if parts.scheme == "https":
        conn = _PinnedHTTPSConnection(destination, timeout=timeout,
                                      context=ssl.create_default_context())
    else:
        conn = _PinnedHTTPConnection(destination, timeout=timeout)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    # never the credentials or the query (they may hold tokens); secret paths are redacted
    where = secrets_redact(f"{parts.scheme}://{host}:{port}{parts.path}")
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
