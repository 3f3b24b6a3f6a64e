"""Calls to a tool on the tenant's MCP server (Model Context Protocol, streamable HTTP), with
the `mcp` package's client: initialize, then one `tools/call`.

args: tool (the remote tool's name), arguments (a JSON object, default {}).
credentials (connector "mcp", label = the server's name in a definition): url (http(s)), and
optionally headers (an object of strings, sent with every request) and token (sent as
`Authorization: Bearer`).
result: {"content": [the content blocks as JSON], "structured": <structuredContent or null>,
"is_error": <the tool said it failed>}. A tool that fails answers with is_error true: that is
its answer, recorded like any other.

The URL is the tenant's, so it passes the SSRF guard (transport.destination_resolve): resolved
once, every address public and the port allowed (unless CONNECTOR_ALLOW_PRIVATE_DESTINATIONS),
and every connection of the session goes to a checked address (the name stays Host and TLS
server name); the client follows redirects only within the URL's origin, so no other host is
ever reached. No proxy from the environment is used. The whole session (connect, initialize,
the call, every answer) has one deadline, MCP_TIMEOUT_SECONDS, and the bytes read per
connection are capped.

MCP has no idempotency keys. Ours travels in the request's `_meta`
("io.agentplatform/idempotency-key") for servers that care to read it, but nothing promises that,
so the connector declares that it does not honour keys and cannot look an earlier call up: a
call that may have reached the server (a worker killed mid-call, a timeout or a broken
connection after `tools/call` went out) is put to a person, never made again blindly.
"""

from typing import Any
from urllib.parse import urlsplit

import anyio
import httpcore2
import httpx2
from django.conf import settings
from mcp import types
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from . import transport
from .base import Call, Connector, ConnectorError, connector_register

META_KEY = "io.agentplatform/idempotency-key"
# JSON-RPC errors that say the server did not run the call (bad request, no such method or
# tool, invalid params); any other error answer may come from a call that acted
REFUSALS = {-32700, -32600, -32601, -32602}
INTERNAL_ERROR = -32603
RESERVED_HEADERS = {"host", "content-length", "transfer-encoding", "connection", "content-type",
                    "accept", "mcp-session-id", "mcp-protocol-version"}
ERROR_TEXT_MAX = 500


class McpConnector(Connector):
    name = "mcp"
    honours_idempotency_key = False  # the key is in _meta, but no server promises to read it
    credential_strings = ("url", "token")
    # lookup: the default, Lookup.UNKNOWN (MCP has no way to ask about an earlier call)

    def credential_problem(self, secrets: dict[str, Any]) -> str:
        problem = super().credential_problem(secrets)
        if problem:
            return problem
        url = secrets.get("url")
        if not isinstance(url, str) or not _url_parts(url):
            return "'url' must be an http:// or https:// URL with a host"
        if transport.request_problem("POST", _target(url), {}):
            return ("'url': its path or query holds spaces, control or non-ASCII characters "
                    "(percent-encode them)")
        headers = secrets.get("headers", {})
        if not isinstance(headers, dict) or not all(
                isinstance(name, str) and isinstance(value, str) for name, value in headers.items()):
            return "'headers' must be an object of strings"
        reserved = sorted(name for name in headers if name.lower() in RESERVED_HEADERS
                          or (name.lower() == "authorization" and secrets.get("token")))
        if reserved:
            return f"'headers' may not set {', '.join(reserved)} (the client sets them)"
        sendable = transport.request_problem("POST", "/", headers)
        return f"'headers': {sendable}" if sendable else ""

    def execute(self, call: Call) -> dict[str, Any]:
        tool, arguments = call.args.get("tool"), call.args.get("arguments", {})
        if not isinstance(tool, str) or not tool:
            raise ConnectorError("mcp: 'tool' (the remote tool's name) is required", retryable=False)
        if not isinstance(arguments, dict):
            raise ConnectorError("mcp: 'arguments' must be a JSON object", retryable=False)
        if not call.credentials.get("url"):
            raise ConnectorError("mcp: this tenant has no mcp credential with that label (or it has no "
                                 "url)", retryable=False)
        problem = self.credential_problem(call.credentials)  # one stored before the check
        if problem:
            raise ConnectorError(f"mcp: the tenant's mcp credential is invalid: {problem}",
                                 retryable=False)
        url = call.credentials["url"]
        _, host, port = _url_parts(url)
        destination = transport.destination_resolve(host, port, receiver="mcp",
                                                    ports=settings.CONNECTOR_HTTP_PORTS)
        headers = dict(call.credentials.get("headers") or {})
        if call.credentials.get("token"):
            headers["Authorization"] = f"Bearer {call.credentials['token']}"
        session = _Session(url, destination, headers, settings.MCP_TIMEOUT_SECONDS)
        return session.call(tool, arguments, idempotency_key=call.idempotency_key)


class _Session:
    """One MCP session for one call, on the async client, run to completion in this thread."""

    def __init__(self, url: str, destination: transport.Destination, headers: dict[str, str],
                 timeout: float):
        self.url, self.destination, self.headers, self.timeout = url, destination, headers, timeout
        self.calling = False  # tools/call is about to go out: from here a failure may have acted
        self.result: dict[str, Any] | None = None

    def call(self, tool: str, arguments: dict, *, idempotency_key: str) -> dict[str, Any]:
        try:
            anyio.run(self._call, tool, arguments, idempotency_key)
        except BaseException as group:  # noqa: BLE001  (task groups wrap what failed)
            if self.result is not None:  # the answer came; closing the session failed
                return self.result
            exc = _leaf(group)
            if isinstance(exc, ConnectorError):
                raise exc from None
            if isinstance(exc, KeyboardInterrupt | SystemExit):
                raise
            raise self._error(exc) from None
        return self.result

    async def _call(self, tool: str, arguments: dict, idempotency_key: str) -> None:
        client = httpx2.AsyncClient(
            transport=_PinnedTransport(self.destination), headers=self.headers,
            timeout=httpx2.Timeout(self.timeout), trust_env=False, follow_redirects=False)
        with anyio.fail_after(self.timeout):
            async with client, streamable_http_client(self.url, http_client=client) as (read, write), \
                    ClientSession(read, write, read_timeout_seconds=self.timeout) as session:
                await session.initialize()
                self.calling = True
                # send_request, not call_tool: call_tool then lists the tools to check the answer
                # against the tool's output schema, and a failure there (after the tool ran)
                # would lose an answer we hold. The answer is recorded as the server gave it.
                answer = await session.send_request(
                    types.CallToolRequest(params=types.CallToolRequestParams(
                        name=tool, arguments=arguments, _meta={META_KEY: idempotency_key})),
                    types.CallToolResult)
                self.result = {  # the ledger makes it storable (U+0000, NaN) as it records

                    "content": [block.model_dump(mode="json", by_alias=True, exclude_none=True)
                                for block in answer.content],
                    "structured": answer.structured_content,
                    "is_error": bool(answer.is_error),
                }

    def _error(self, exc: BaseException) -> ConnectorError:
        where = f"mcp: {self.destination.host}:{self.destination.port}"
        if isinstance(exc, MCPError):
            refused = exc.code in REFUSALS or not self.calling
            return ConnectorError(
                f"{where}: the server answered with error {exc.code}: "
                f"{str(exc.message)[:ERROR_TEXT_MAX]}",
                # an internal error (an HTTP 5xx, too) before the call may pass; the rest won't
                retryable=not self.calling and exc.code == INTERNAL_ERROR,
                # before tools/call, or a refusal of it: the tool did not run
                sent=self.calling and not refused)
        if isinstance(exc, TimeoutError):
            reason = f"no answer within {self.timeout:g}s"
        elif isinstance(exc, httpx2.HTTPStatusError):
            reason = f"HTTP {exc.response.status_code}"
        else:
            reason = f"{type(exc).__name__}: {str(exc)[:ERROR_TEXT_MAX]}" if str(exc) else type(exc).__name__
        if self.calling:
            return ConnectorError(f"{where}: the call broke off ({reason}); the tool may have run",
                                  retryable=True, sent=True)
        return ConnectorError(f"{where}: no session ({reason}); the tool was not called",
                              retryable=True, sent=False)


class _PinnedTransport(httpx2.AsyncHTTPTransport):
    """httpx2's transport with connections made by `_PinnedBackend` (no proxy, no other host)."""

    def __init__(self, destination: transport.Destination):
        super().__init__(trust_env=False)
        # The pool is the transport's one seam for the network: the same pool httpx2 would
        # make, connecting only to the checked addresses.
        self._pool = httpcore2.AsyncConnectionPool(
            ssl_context=httpx2.create_ssl_context(trust_env=False),
            network_backend=_PinnedBackend(destination), max_connections=4)


class _PinnedBackend(httpcore2.AsyncNetworkBackend):
    """Connects only to the destination's checked addresses (the name only for Host and TLS),
    and caps what each connection may read."""

    def __init__(self, destination: transport.Destination):
        self.destination = destination
        self.backend = httpcore2.AnyIOBackend()

    async def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        if host.lower() != self.destination.host.lower() or port != self.destination.port:
            raise httpcore2.ConnectError("only the checked destination may be reached")
        error: Exception = httpcore2.ConnectError(f"{host} has no address")
        for _, address in self.destination.addresses[:transport.ADDRESSES_TRIED_MAX]:
            try:
                stream = await self.backend.connect_tcp(address, port, timeout=timeout,
                                                        socket_options=socket_options)
                return _CappedStream(stream)
            except (httpcore2.ConnectError, httpcore2.ConnectTimeout) as exc:
                error = exc
        raise error

    async def connect_unix_socket(self, path, timeout=None, socket_options=None):
        raise httpcore2.ConnectError("unix sockets are not destinations")

    async def sleep(self, seconds: float) -> None:
        await self.backend.sleep(seconds)


class _CappedStream(httpcore2.AsyncNetworkStream):
    LIMIT = transport.RESPONSE_MAX_BYTES + transport.HEAD_MAX_BYTES

    def __init__(self, stream: httpcore2.AsyncNetworkStream, count: int = 0):
        self.stream, self.count = stream, count

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        if self.count > self.LIMIT:
            raise httpcore2.ReadError(f"the server sent more than {self.LIMIT} bytes")
        data = await self.stream.read(max_bytes, timeout)
        self.count += len(data)
        return data

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        await self.stream.write(buffer, timeout)

    async def aclose(self) -> None:
        await self.stream.aclose()

    async def start_tls(self, ssl_context, server_hostname=None, timeout=None):
        return _CappedStream(await self.stream.start_tls(ssl_context, server_hostname, timeout), self.count)

    def get_extra_info(self, info: str) -> Any:
        return self.stream.get_extra_info(info)


def _url_parts(url: str) -> tuple[str, str, int] | None:
    try:
        parts = urlsplit(url)
        port = parts.port or transport.DEFAULT_PORTS.get(parts.scheme)
    except ValueError:
        return None
    if parts.scheme not in transport.DEFAULT_PORTS or not parts.hostname or port is None:
        return None
    return parts.scheme, parts.hostname, port


def _target(url: str) -> str:
    parts = urlsplit(url)
    return (parts.path or "/") + (f"?{parts.query}" if parts.query else "")


def _leaf(exc: BaseException) -> BaseException:
    """The first exception inside (nested) exception groups: what actually failed."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


connector_register(McpConnector())
