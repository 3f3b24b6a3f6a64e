"""Sandbox egress: a tenant's allow-list, and the host-side CONNECT proxy that enforces it.

A jail never gets a route out. When its tenant has an allow-list, the sandbox call gets an
`EgressProxy`: a thread of the worker listening on a Unix socket that is bind-mounted into the
jail, where a small forwarder (`FORWARDER`, run inside the jail before the command) relays
127.0.0.1:3128 to it. The proxy only tunnels `CONNECT host:port` to allow-listed hosts, resolves
names itself, and refuses names that resolve to loopback, private, link-local or other
non-public addresses (agentplatform.addresses, the connectors' check), so the jail cannot reach
the database or the host through it. One call holds at most `max_connections` connections at
once (each costs the worker two threads); the next gets `503` until one closes. No tunnel
outlives its call: leaving the proxy shuts down every socket it holds and joins its threads (with
a deadline), and a tunnel idle for TUNNEL_IDLE_SECONDS in a direction stops relaying it.
"""

import ipaddress
import logging
import os
import re
import shutil
import socket
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from agentplatform.addresses import address_refusal

logger = logging.getLogger("sandboxes.egress")

PROXY_PORT = 3128  # on the jail's own loopback
JAIL_SOCKET = "/run/egress.sock"
DEFAULT_PORTS = frozenset({80, 443})
HEAD_MAX_BYTES = 8192
HEAD_TIMEOUT_SECONDS = 10.0
CONNECT_TIMEOUT_SECONDS = 10.0
DEFAULT_MAX_CONNECTIONS = 16
TUNNEL_IDLE_SECONDS = 60.0  # a direction of a tunnel that carries nothing this long is closed
EXIT_JOIN_SECONDS = 2.0  # how long leaving the proxy waits, in all, for its threads

_LABEL = r"[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?"
_NAME = re.compile(rf"^(?=.{{1,253}}$){_LABEL}(\.{_LABEL})*$")


class EgressRuleInvalid(ValueError):
    """An allow-list entry that is not `host`, `*.domain` or an IP literal, with an optional port."""


@dataclass(frozen=True)
class EgressRule:
    """One allow-list entry: `host` is a name, a `*.`-suffix, or an IP literal."""

    host: str
    port: int | None  # None: 80 and 443

    @property
    def wildcard(self) -> bool:
        return self.host.startswith("*.")

    @property
    def ip(self) -> bool:
        return _ip(self.host) is not None

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port is None else f"{host}:{self.port}"

    def matches(self, host: str, port: int) -> bool:
        if port not in ({self.port} if self.port is not None else DEFAULT_PORTS):
            return False
        if self.ip or _ip(host) is not None:  # IP literals only ever match themselves
            return _ip(self.host) == _ip(host)
        if self.wildcard:
            return host.endswith(self.host[1:])
        return host == self.host


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _split_host_port(text: str) -> tuple[str, int | None]:
    text = text.strip().lower()
    if text.startswith("["):  # [v6] or [v6]:port
        host, _, rest = text[1:].partition("]")
        if rest and not rest.startswith(":"):
            raise EgressRuleInvalid(text)
        port = rest[1:] or None
    elif text.count(":") == 1:
        host, port = text.split(":")
    else:
        host, port = text, None
    if port is not None:
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise EgressRuleInvalid(f"{text!r}: bad port")
        port = int(port)
    return host.rstrip("."), port


def egress_rule_parse(text: str) -> EgressRule:
    """`api.example.com`, `*.example.com`, `api.example.com:8443`, `10.1.2.3:5000`, `[::1]:80`."""
    host, port = _split_host_port(text)
    address = _ip(host)
    if address is not None:
        return EgressRule(host=str(address), port=port)
    name = host[2:] if host.startswith("*.") else host
    if not _NAME.match(name) or "." not in name and host.startswith("*."):
        raise EgressRuleInvalid(f"{text!r} is not a host name, a '*.' domain or an IP address")
    return EgressRule(host=host, port=port)


@dataclass(frozen=True)
class EgressPolicy:
    """What one sandbox call may reach, and whose call it is (for the log)."""

    tenant: str
    run: str
    rules: tuple[EgressRule, ...]

    def decide(self, host: str, port: int) -> tuple[list[tuple], str]:
        """(addresses to try, "") if allowed, else ([], why not). Resolves names on the host."""
        matching = [rule for rule in self.rules if rule.matches(host, port)]
        if not matching:
            return [], "not on the tenant's egress allow-list"
        literal = _ip(host)
        if literal is not None:  # named exactly by a rule: allowed even if private
            family = socket.AF_INET6 if literal.version == 6 else socket.AF_INET
            return [(family, (str(literal), port))], ""
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            return [], f"does not resolve ({exc.strerror or exc})"
        addresses = []
        for family, _, _, _, sockaddr in infos:
            why = address_refusal(sockaddr[0])
            if why:
                return [], f"resolves to a non-public address ({why})"
            addresses.append((family, sockaddr))
        return addresses, ""


def _parse_target(head: bytes) -> tuple[str, int] | None:
    """host, port of a `CONNECT host:port HTTP/1.x` request head; None for anything else."""
    line = head.split(b"\r\n", 1)[0].decode("latin-1")
    parts = line.split(" ")
    if len(parts) != 3 or parts[0] != "CONNECT" or not parts[2].startswith("HTTP/1."):
        return None
    try:
        host, port = _split_host_port(parts[1])
    except EgressRuleInvalid:
        return None
    if port is None or not host:
        return None
    return host, port


def _answer(client: socket.socket, status: str, reason: str = "") -> None:
    body = (reason + "\n").encode() if reason else b""
    client.sendall(f"HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: "
                   f"{len(body)}\r\nConnection: close\r\n\r\n".encode() + body)


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    try:
        while chunk := source.recv(65536):
            sink.sendall(chunk)
    except OSError:
        pass
    finally:
        try:
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            pass


class EgressProxy:
    """The host-side proxy for one sandbox call; a context manager that yields its socket path."""

    def __init__(self, policy: EgressPolicy, *, owner_uid: int | None = None,
                 max_connections: int = DEFAULT_MAX_CONNECTIONS):
        self.policy = policy
        self.owner_uid = owner_uid
        self.max_connections = max_connections
        self._open = 0
        self._open_lock = threading.Lock()
        self.dir: Path | None = None
        self.path: Path | None = None
        self._server: socket.socket | None = None
        self._closing = threading.Event()
        self._sockets: set[socket.socket] = set()  # every client and upstream socket still open
        self._threads: set[threading.Thread] = set()  # the accept loop and every tunnel's

    def __enter__(self) -> Path:
        self.dir = Path(tempfile.mkdtemp(prefix="ap-egress-"))
        self.dir.chmod(0o711)  # the jail's host uid must reach the socket, nobody may list it
        self.path = self.dir / "proxy.sock"
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(str(self.path))
        if self.owner_uid is not None and os.geteuid() == 0:
            os.chown(self.path, self.owner_uid, self.owner_uid)
        self.path.chmod(0o600)
        server.listen(64)
        self._server = server
        self._spawn(self._accept, name="egress-accept")
        return self.path

    def __exit__(self, *exc) -> None:
        """Stop accepting, shut down every tunnel's sockets (which ends their relays), and
        join the threads; a thread still stuck (a name lookup) after EXIT_JOIN_SECONDS is left,
        a daemon that holds no socket of the call."""
        self._closing.set()
        try:
            self._server.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._server.close()
        with self._open_lock:
            sockets = list(self._sockets)
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        deadline = time.monotonic() + EXIT_JOIN_SECONDS
        with self._open_lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        shutil.rmtree(self.dir, ignore_errors=True)

    def live_threads(self) -> int:
        """How many of this proxy's threads are still running."""
        with self._open_lock:
            return sum(thread.is_alive() for thread in self._threads)

    def _spawn(self, target, *, name: str, args: tuple = ()) -> threading.Thread:
        def run() -> None:
            try:
                target(*args)
            finally:
                with self._open_lock:
                    self._threads.discard(thread)
        thread = threading.Thread(target=run, name=name, daemon=True)
        with self._open_lock:
            self._threads.add(thread)
        thread.start()
        return thread

    def _track(self, sock: socket.socket) -> bool:
        """Hold `sock` for shutdown at exit; False (and it is closed) if the proxy is closing."""
        with self._open_lock:
            if not self._closing.is_set():
                self._sockets.add(sock)
                return True
        sock.close()
        return False

    def _untrack(self, sock: socket.socket) -> None:
        with self._open_lock:
            self._sockets.discard(sock)
        sock.close()

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            with self._open_lock:
                full = self._open >= self.max_connections
                if not full:
                    self._open += 1
            if full:
                self._refuse_over_cap(client)
                continue
            if not self._track(client):
                with self._open_lock:
                    self._open -= 1
                return
            self._spawn(self._serve, name="egress-conn", args=(client,))

    def _refuse_over_cap(self, client: socket.socket) -> None:
        self._log(None, None, False, f"over {self.max_connections} concurrent connections")
        try:
            client.settimeout(1.0)
            _answer(client, "503 Service Unavailable",
                    f"egress: at most {self.max_connections} concurrent connections per sandbox "
                    "call")
        except OSError:
            pass
        finally:
            client.close()

    def _serve(self, client: socket.socket) -> None:
        try:
            self._tunnel(client)
        finally:
            with self._open_lock:
                self._open -= 1

    def _tunnel(self, client: socket.socket) -> None:
        upstream = None
        try:
            client.settimeout(HEAD_TIMEOUT_SECONDS)
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = client.recv(HEAD_MAX_BYTES)
                if not chunk:
                    return
                head += chunk
                if len(head) > HEAD_MAX_BYTES:
                    _answer(client, "431 Request Header Fields Too Large")
                    return
            head, _, early = head.partition(b"\r\n\r\n")
            target = _parse_target(head)
            if target is None:
                self._log(None, None, False, "not a CONNECT request")
                _answer(client, "403 Forbidden", "egress: only CONNECT host:port is proxied")
                return
            host, port = target
            addresses, why = self.policy.decide(host, port)
            if not addresses:
                self._log(host, port, False, why)
                _answer(client, "403 Forbidden", f"egress to {host}:{port} denied: {why}")
                return
            for family, sockaddr in addresses:
                try:
                    upstream = socket.socket(family, socket.SOCK_STREAM)
                    if not self._track(upstream):
                        upstream = None
                        return
                    upstream.settimeout(CONNECT_TIMEOUT_SECONDS)
                    upstream.connect(sockaddr)
                    break
                except OSError as exc:
                    self._untrack(upstream)
                    upstream, why = None, f"connect failed ({exc.strerror or exc})"
            if upstream is None:
                self._log(host, port, False, why)
                _answer(client, "502 Bad Gateway", f"egress to {host}:{port}: {why}")
                return
            self._log(host, port, True, "")
            client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            client.settimeout(TUNNEL_IDLE_SECONDS)
            upstream.settimeout(TUNNEL_IDLE_SECONDS)
            if early:
                upstream.sendall(early)
            back = self._spawn(_pipe, name="egress-pipe", args=(upstream, client))
            _pipe(client, upstream)
            back.join()
        except OSError:
            pass
        finally:
            if upstream is not None:
                self._untrack(upstream)
            self._untrack(client)

    def _log(self, host: str | None, port: int | None, allowed: bool, reason: str) -> None:
        logger.info("sandbox egress %s tenant=%s run=%s host=%s port=%s%s",
                    "allowed" if allowed else "denied", self.policy.tenant, self.policy.run,
                    host, port, f" reason={reason!r}" if reason else "",
                    extra={"tenant": self.policy.tenant, "run_id": self.policy.run,
                           "egress_host": host, "egress_port": port, "egress_allowed": allowed})


# Runs inside the jail (python3 -I -S -c FORWARDER <socket> <command…>): listens on the jail's
# loopback, then forks; the child relays each connection to the proxy's socket, the parent
# becomes the command (so its exit code is the call's). The PID namespace ends with the command.
FORWARDER = r"""
import os, socket, sys, threading
path, argv = sys.argv[1], sys.argv[2:]
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("127.0.0.1", PORT))
server.listen(64)
if os.fork():
    server.close()
    os.execvp(argv[0], argv)
devnull = os.open(os.devnull, os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(devnull, fd)
def pipe(a, b):
    try:
        while True:
            data = a.recv(65536)
            if not data:
                break
            b.sendall(data)
    except OSError:
        pass
    try:
        b.shutdown(socket.SHUT_WR)
    except OSError:
        pass
def serve(client):
    try:
        up = socket.socket(socket.AF_UNIX)
        up.connect(path)
    except OSError:
        client.close()
        return
    t = threading.Thread(target=pipe, args=(up, client), daemon=True)
    t.start()
    pipe(client, up)
    t.join()
    up.close()
    client.close()
while True:
    try:
        c, _ = server.accept()
    except OSError:
        break
    threading.Thread(target=serve, args=(c,), daemon=True).start()
""".replace("PORT", str(PROXY_PORT))
