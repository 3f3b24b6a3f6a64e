"""Local stand-ins for the world: HTTP servers that speak Slack's, Stripe's and OpenAI's wire
formats and count what they receive, and a real SMTP server (aiosmtpd).

Each HTTP fake is a ThreadingHTTPServer on 127.0.0.1. In a test, use the fixtures in
tests/support/fakes/fixtures.py; from another process (workers, benchmarks), run one standalone:

    python -m tests.support.fakes.stripe --port 18411

and read what it saw with `GET /_fake/state` (JSON), clear it with `POST /_fake/reset`, or
change its behaviour with `POST /_fake/config` (JSON object of attributes, e.g. {"delay": 2}).
"""

import argparse
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

DROP = 0  # a status for `handle` to return: close the connection without answering


class FakeHandler(BaseHTTPRequestHandler):
    server: "FakeServer"
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):  # noqa: A002  (quiet: tests read state, not logs)
        pass

    def do_GET(self):  # noqa: N802
        self._dispatch("GET")

    def do_POST(self):  # noqa: N802
        self._dispatch("POST")

    def _dispatch(self, method: str):
        parts = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        fake = self.server.fake
        if parts.path == "/_fake/state" and method == "GET":
            return self.send_json(200, fake.state())
        if parts.path == "/_fake/reset" and method == "POST":
            fake.reset()
            return self.send_json(200, {"ok": True})
        if parts.path == "/_fake/config" and method == "POST":
            for name, value in json.loads(raw or b"{}").items():
                fake.configure(name, value)
            return self.send_json(200, {"ok": True})
        status, body, headers = fake.handle(method, parts.path, dict(parse_qsl(parts.query)),
                                            self.headers, raw)
        if status == DROP:  # the request was taken in, the answer is lost on the way back
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.send_json(status, body, headers)

    def send_json(self, status: int, body: Any, headers: dict[str, str] | None = None):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)


class FakeServer:
    """A fake receiver: subclasses implement `handle` and `state`; all counters under `lock`."""

    name = "fake"
    configurable: tuple[str, ...] = ()

    def __init__(self, port: int = 0):
        self.lock = threading.RLock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), FakeHandler)
        self.httpd.daemon_threads = True
        self.httpd.fake = self
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread: threading.Thread | None = None
        self.reset()

    def reset(self) -> None:
        raise NotImplementedError

    def state(self) -> dict[str, Any]:
        raise NotImplementedError

    def handle(self, method: str, path: str, query: dict, headers, raw: bytes
               ) -> tuple[int, Any, dict[str, str]]:
        raise NotImplementedError

    def configure(self, name: str, value: Any) -> None:
        if name not in self.configurable:
            raise ValueError(f"{self.name}: {name!r} is not configurable ({self.configurable})")
        with self.lock:
            setattr(self, name, value)

    def start(self) -> "FakeServer":
        self.thread = threading.Thread(target=self.httpd.serve_forever, name=f"fake-{self.name}",
                                       daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    @classmethod
    def main(cls) -> None:
        parser = argparse.ArgumentParser(description=f"A local fake {cls.name} server")
        parser.add_argument("--port", type=int, default=0)
        port = parser.parse_args().port
        server = cls(port)
        print(f"fake {cls.name} listening on {server.url}", flush=True)
        try:
            server.httpd.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.httpd.server_close()


def bearer(headers) -> str:
    scheme, _, token = (headers.get("Authorization") or "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""
