"""No egress tunnel outlives its sandbox call: leaving the proxy shuts every tunnel down and
joins its threads, and a tunnel that carries nothing for TUNNEL_IDLE_SECONDS is closed. The
upstream here is a server on 127.0.0.1 that accepts and never says or closes anything."""

import socket
import threading

import pytest

from sandboxes import egress as egress_module
from sandboxes.egress import EgressProxy
from tests.sandboxes.test_egress import jailed, policy
from tests.support.waiting import wait_for

PROXY_THREADS = ("egress-conn", "egress-pipe")

HOLD = r"""
import socket, sys
socks = []
for _ in range(int(sys.argv[2])):
    s = socket.create_connection(("127.0.0.1", 3128))
    s.sendall(("CONNECT %s HTTP/1.1\r\n\r\n" % sys.argv[1]).encode())
    print(s.recv(100)[:12])
    socks.append(s)
"""


@pytest.fixture
def silent_server():
    """Accepts every connection and holds it open, silent, until the test ends."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(100)
    held = []

    def accept():
        while True:
            try:
                held.append(server.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    yield server.getsockname()[1]
    server.close()
    for conn in held:
        conn.close()


def proxy_threads() -> int:
    return sum(thread.name in PROXY_THREADS for thread in threading.enumerate())


def test_tunnels_to_an_upstream_that_never_closes_end_with_the_call(silent_server):
    before = proxy_threads()
    egress = policy(f"127.0.0.1:{silent_server}")
    for _ in range(3):
        result = jailed(["python3", "-c", HOLD, f"127.0.0.1:{silent_server}", "4"],
                        egress=egress)
        assert result.stdout.count("200") == 4, result
    # Twelve tunnels (24 threads) stayed open for good before; now none outlives its call.
    wait_for(lambda: proxy_threads() == before, timeout=5,
             what="no egress thread alive after its call")


def test_an_idle_tunnel_is_closed(silent_server, monkeypatch):
    monkeypatch.setattr(egress_module, "TUNNEL_IDLE_SECONDS", 0.5)
    with EgressProxy(policy(f"127.0.0.1:{silent_server}")) as path:
        client = socket.socket(socket.AF_UNIX)
        client.connect(str(path))
        client.sendall(f"CONNECT 127.0.0.1:{silent_server} HTTP/1.1\r\n\r\n".encode())
        client.settimeout(10)
        assert client.recv(100).startswith(b"HTTP/1.1 200")
        client.shutdown(socket.SHUT_WR)  # the jail's side is done; upstream stays silent
        assert client.recv(100) == b""  # closed by the idle timeout, not the call's end
        client.close()
