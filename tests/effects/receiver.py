"""A local receiver for effect tests: counts what arrives, deduplicates by Idempotency-Key
when asked to (like Stripe), answers lookups, can kill the sending worker mid-call, answer
/notify slowly or not until released, and fail /charge (503: refused before acting; 500: acted, maybe)."""

import json
import os
import signal
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import psycopg
from django.conf import settings


class Receiver:
    def __init__(self, *, schema: str = "acme", dedupe: bool = True):
        self.schema, self.dedupe = schema, dedupe
        self.lock = threading.Lock()
        self.requests: list[dict] = []  # every request, duplicates included
        self.by_key: dict[str, dict] = {}  # first response per key
        self.notify_failures = 0  # answer /notify with 500 this many times first
        self.kill_runs: set[str] = set()  # kill the worker holding these runs, once each
        self.notify_delay = 0.0  # answer /notify after this many seconds
        self.hold_notify = False  # keep /notify unanswered until `release` is set
        self.release = threading.Event()
        self.charge_errors: list[int] = []  # answer the next /charge requests with these
        self.raw_answer: bytes | None = None  # a success's body as is (JSON jsonb refuses)
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                key = self.headers.get("Idempotency-Key", "")
                path = urlparse(self.path).path
                with receiver.lock:
                    receiver.requests.append({"path": path, "key": key, "body": body,
                                              "at": time.time()})
                    if path.endswith("/notify") and receiver.notify_failures > 0:
                        receiver.notify_failures -= 1
                        return self._answer(500, {"error": "try later"})
                    if path.endswith("/charge") and receiver.charge_errors:
                        code = receiver.charge_errors.pop(0)
                        if code == 503:  # refused at the door: it never arrived
                            receiver.requests.pop()
                        return self._answer(code, {"error": "not now"})
                    seen = receiver.by_key.get(key) if receiver.dedupe else None
                    if seen is None:
                        seen = {"id": f"ch_{len(receiver.by_key) + 1}", "amount":
                                body.get("amount"), "key": key}
                        receiver.by_key[key] = seen
                    victim = body.get("run") in receiver.kill_runs
                    receiver.kill_runs.discard(body.get("run"))
                if victim:  # it arrived; the sender dies before it hears back
                    receiver.kill_holder(body["run"])
                    return
                if path.endswith("/notify"):
                    if receiver.hold_notify:
                        receiver.release.wait(timeout=60)
                    time.sleep(receiver.notify_delay)
                self._answer(200, seen)

            def do_GET(self):
                key = parse_qs(urlparse(self.path).query).get("key", [""])[0]
                found = receiver.by_key.get(key)
                self._answer(200 if found else 404, found or {"error": "no such key"})

            def _answer(self, status, body):
                payload = json.dumps(body).encode()
                if status == 200 and receiver.raw_answer is not None:
                    payload = receiver.raw_answer
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def kill_holder(self, run_id: str) -> None:
        db = settings.DATABASES["default"]
        with psycopg.connect(host=db["HOST"], port=db["PORT"], user=db["USER"],
                             dbname=db["NAME"]) as conn:
            owner = conn.execute(f'SELECT lease_owner FROM "{self.schema}".runs_run '
                                 "WHERE id = %s", [run_id]).fetchone()[0]
        pid = int(owner.rsplit(":", 1)[1])
        os.killpg(os.getpgid(pid), signal.SIGKILL)  # the whole worker, like a lost host

    def charges(self, path="/charge") -> Counter:
        """How many times each key was *acted on* (a dedupe hit is not an action)."""
        with self.lock:
            if self.dedupe:
                return Counter(k for k in self.by_key if any(
                    r["key"] == k and r["path"] == path for r in self.requests))
            return Counter(r["key"] for r in self.requests if r["path"] == path)

    def count(self, path="/charge") -> int:
        with self.lock:
            return sum(1 for r in self.requests if r["path"] == path)

    def keys(self, path="/notify") -> Counter:
        """How many requests arrived per key, duplicates included."""
        with self.lock:
            return Counter(r["key"] for r in self.requests if r["path"] == path)

    def close(self):
        self.release.set()
        self.server.shutdown()
