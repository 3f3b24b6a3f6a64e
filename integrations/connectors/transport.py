"""One HTTP exchange within one deadline, telling apart "never sent" from "maybe delivered";
and the SSRF guard every connector's destination passes (`destination_resolve`).

Built on http.client rather than urllib so a failure to connect (the receiver saw nothing: safe
to send again) is distinguishable from a failure after the request went out (it may have acted).
A destination's name is resolved once (`resolve`), every address it resolves to is checked, and
the connection goes to a checked address while Host and TLS SNI keep the name: a second lookup
(DNS rebinding) never happens. Nothing here logs; headers carry secrets.

A call has one `Deadline` (CONNECTOR_TIMEOUT_SECONDS) for connecting, sending and the whole
answer: every socket operation waits only for the time left, so a receiver that answers a byte
at a time cannot hold a worker past it (the outbox's claim outlives any connector call).
"""

import http.client
import io
import json
import re
import socket
import ssl
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings

from agentplatform.addresses import address_refusal

from .base import ConnectorError

RESPONSE_MAX_BYTES = 4 * 1024 * 1024
HEAD_MAX_BYTES = 256 * 1024  # status line and headers, on top of the body's cap
ADDRESSES_TRIED_MAX = 3
READ_CHUNK = 64 * 1024
DEFAULT_PORTS = {"http": 80, "https": 443}
# what http.client would refuse (or encode) halfway through sending: checked before connecting
_TARGET = re.compile(r"/[\x21-\x7e]*")
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_HEADER_VALUE = re.compile(r"[\t\x20-\x7e]*")
_METHOD = re.compile(r"[A-Z]+")


class Deadline:
    """The time one connector call has left, on the monotonic clock."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        """Seconds left; TimeoutError when none are (every wait of the call asks this first)."""
        remaining = self.end - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"the call's {self.seconds:g}s deadline passed")
        return remaining


class DeadlineReader(io.RawIOBase):
    """A socket's reading side for http.client and smtplib: each recv waits only for the time
    the call has left, and more than `limit` bytes in all is an error (the answer is too big).
    Reads through the socket's own file, so the socket stays open while it is read (http.client
    closes its connection as soon as a response says it will close)."""

    def __init__(self, sock: socket.socket, deadline: Deadline, limit: int):
        super().__init__()
        self.sock, self.deadline, self.limit, self.count = sock, deadline, limit, 0
        self.raw = sock.makefile("rb", buffering=0)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if self.count > self.limit:
            raise OSError(f"the answer is larger than {self.limit} bytes")
        self.sock.settimeout(self.deadline.left())
        received = self.raw.readinto(buffer)
        self.count += received or 0
        return received

    def close(self) -> None:
        self.raw.close()
        super().close()

    def makefile(self, *_args, **_kwargs) -> io.BufferedReader:  # http.client's response asks
        return io.BufferedReader(self)


@dataclass(frozen=True)
class Response:
    status: int
    headers: dict[str, str]  # lower-cased names
    body: bytes

    def json(self) -> Any:
        """The body as JSON, or None. (NaN, Infinity, U+0000 or a lone surrogate, which
        json.loads reads and jsonb refuses, the ledger makes storable when it records.)"""
        try:
            return json.loads(self.body or b"null")
        except (ValueError, RecursionError):
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

    def connect(self, deadline: Deadline) -> socket.socket:
        """A TCP connection to the first checked address that answers (of the first
        ADDRESSES_TRIED_MAX), within the deadline; never to the name. The socket's timeout is
        left at the time remaining, for a TLS handshake that follows."""
        error: OSError = OSError(f"{self.host} has no address")
        for family, address in self.addresses[:ADDRESSES_TRIED_MAX]:
            sock = socket.socket(family, socket.SOCK_STREAM)
            try:
                sock.settimeout(deadline.left())
                sock.connect((address, self.port))
                sock.settimeout(deadline.left())
                return sock
            except OSError as exc:
                sock.close()
                error = exc
        raise error


def resolve(host: str, port: int) -> list[tuple[int, str]]:
    """The one DNS lookup of a destination: its (family, address) pairs."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [(family, sockaddr[0].split("%")[0]) for family, _, _, _, sockaddr in infos]


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


class _Pinned:
    """http.client with the socket made to a checked address (Host stays the name), sending
    within the deadline and reading the answer through a DeadlineReader."""

    def pin(self, destination: Destination, deadline: Deadline) -> None:
        self.deadline = deadline
        self._create_connection = lambda _address, _timeout, _source: destination.connect(deadline)

    def send(self, data) -> None:
        self.sock.settimeout(self.deadline.left())  # sendall's timeout covers all of `data`
        super().send(data)

    def response_class(self, sock, *args, **kwargs) -> http.client.HTTPResponse:
        reader = DeadlineReader(sock, self.deadline, RESPONSE_MAX_BYTES + HEAD_MAX_BYTES)
        return http.client.HTTPResponse(reader, *args, **kwargs)


class _PinnedHTTPConnection(_Pinned, http.client.HTTPConnection):
    def __init__(self, destination: Destination, deadline: Deadline):
        super().__init__(destination.host, destination.port, timeout=deadline.left())
        self.pin(destination, deadline)


class _PinnedHTTPSConnection(_Pinned, http.client.HTTPSConnection):
    """Over TLS the certificate is checked against the name (SNI = the name)."""

    def __init__(self, destination: Destination, deadline: Deadline):
        super().__init__(destination.host, destination.port, timeout=deadline.left(),
                         context=ssl.create_default_context())
        self.pin(destination, deadline)


def request_problem(method: str, target: str, headers: dict[str, str]) -> str:
    """Why http.client would refuse this request line or these headers while sending them
    ("" if it would not); never quoting the values, which may hold secrets."""
    if not _METHOD.fullmatch(method):
        return "the method is not a token"
    if not _TARGET.fullmatch(target):
        return ("the URL's path or query holds spaces, control or non-ASCII characters "
                "(percent-encode them)")
    for name, value in headers.items():
        if not isinstance(name, str) or not _HEADER_NAME.fullmatch(name):
            return "a header name is not a token"
        if not isinstance(value, str) or not _HEADER_VALUE.fullmatch(value):
            return (f"the {name} header holds line breaks, control or non-ASCII characters")
    return ""


def request(method: str, url: str, *, headers: dict[str, str], body: bytes | None = None,
            timeout: float | None = None, receiver: str, operator: bool = False) -> Response:
    """Send one request, all of it (lookup, connect, send, answer) within `timeout` (default
    CONNECTOR_TIMEOUT_SECONDS). Raises ConnectorError(retryable=True) on transport failures, with
    `sent=False` only when nothing was sent. A URL or header that cannot be sent as it is raises
    ConnectorError(retryable=False, sent=False) before connecting, without quoting it.
    `operator`: the URL comes from settings, not from a tenant (see destination_resolve)."""
    deadline = Deadline(settings.CONNECTOR_TIMEOUT_SECONDS if timeout is None else timeout)
    try:
        parts = urlsplit(url)
        port = parts.port or DEFAULT_PORTS.get(parts.scheme)
    except ValueError:
        parts, port = None, None
    if parts is None or parts.scheme not in DEFAULT_PORTS or not parts.hostname or port is None:
        raise ConnectorError(f"{receiver}: the URL is not http(s)://host[:port]/... with a valid "
                             "host and port", retryable=False, sent=False)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    problem = request_problem(method, target, headers)
    if problem:
        raise ConnectorError(f"{receiver}: cannot send this request: {problem}",
                             retryable=False, sent=False)
    destination = destination_resolve(parts.hostname, port, receiver=receiver,
                                      ports=settings.CONNECTOR_HTTP_PORTS, operator=operator)
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    # never the credentials or the query (they may hold tokens); secret paths are redacted
    where = f"{parts.scheme}://{host}:{port}{parts.path}"
    connection_class = _PinnedHTTPSConnection if parts.scheme == "https" else _PinnedHTTPConnection
    conn = None
    try:
        try:
            conn = connection_class(destination, deadline)
            conn.connect()
        except (OSError, ssl.SSLError) as exc:
            raise ConnectorError(f"{receiver}: cannot connect to {where}: {_reason(exc)}",
                                 retryable=True, sent=False) from None
        try:
            conn.request(method, target, body=body, headers=headers)
            answer = conn.getresponse()
            data = bytearray()
            while len(data) <= RESPONSE_MAX_BYTES:
                deadline.left()
                chunk = answer.read(READ_CHUNK)
                if not chunk:
                    break
                data += chunk
        except (OSError, http.client.HTTPException) as exc:
            raise ConnectorError(
                f"{receiver}: no complete answer from {where} ({_reason(exc)}); the request may "
                "have been delivered", retryable=True, sent=True) from None
    finally:
        if conn is not None:
            conn.close()
    if len(data) > RESPONSE_MAX_BYTES:
        raise ConnectorError(f"{receiver}: the answer from {where} is larger than "
                             f"{RESPONSE_MAX_BYTES} bytes", retryable=False, sent=True)
    return Response(answer.status, {k.lower(): v for k, v in answer.getheaders()}, bytes(data))


def _reason(exc: BaseException) -> str:
    if isinstance(exc, socket.timeout | TimeoutError):
        return "timed out"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
