"""A DEVELOPMENT STAND-IN for a Stripe-style payments API, for `make run`'s invoice demo only:
no money moves and nothing leaves this machine. It answers `POST /v1/charges` (form-encoded,
bearer `sk_...` key) as the platform's `payments` connector expects, keeps Stripe's
Idempotency-Key promise (the same key gets the first answer again, marked
`Idempotent-Replayed: true`; the same key with other parameters is a 400), and lists what it
charged at `GET /v1/charges`. Standard library only:

    python deploy/demo/payments.py --port 8091

Point a tenant's `payments` credential at it ({"secret_key": "sk_test_demo", "api_url":
"http://127.0.0.1:8091"}); for Stripe's own test mode, use a real `sk_test_` key and no api_url.
"""

import argparse
import json
import secrets
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl

LABEL = "payments stand-in for development (no money moves)"


class Payments:
    def __init__(self):
        self.lock = threading.Lock()
        self.charges: list[dict] = []
        self.keys: dict[tuple[str, str], tuple[dict, dict]] = {}  # (secret, key) -> (params, answer)

    def charge(self, secret: str, key: str, params: dict) -> tuple[int, dict, bool]:
        """(status, body, replayed) for one POST /v1/charges."""
        with self.lock:
            if key and (secret, key) in self.keys:
                stored_params, answer = self.keys[(secret, key)]
                if stored_params != params:
                    return 400, _error("idempotency_error", "Keys for idempotent requests can only "
                                       "be used with the same parameters they were first used with."), False
                return 200, answer, True
            amount = params.get("amount", "")
            if not amount.isdigit() or int(amount) < 1:
                return 400, _error("invalid_request_error", "amount must be a positive integer"), False
            if len(params.get("currency", "")) != 3 or not (params.get("customer") or params.get("source")):
                return 400, _error("invalid_request_error", "currency and customer are required"), False
            answer = {"id": f"ch_demo_{secrets.token_hex(8)}", "object": "charge",
                      "amount": int(amount), "currency": params["currency"].lower(),
                      "customer": params.get("customer"), "description": params.get("description"),
                      "status": "succeeded", "paid": True, "livemode": False,
                      "created": int(time.time()), "stand_in": LABEL}
            self.charges.append(answer)
            if key:
                self.keys[(secret, key)] = (params, answer)
            return 200, answer, False


def _error(kind: str, message: str) -> dict:
    return {"error": {"type": kind, "message": f"{LABEL}: {message}"}}


class _Handler(BaseHTTPRequestHandler):
    server: "PaymentsServer"
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):  # noqa: A002
        pass

    def _secret(self) -> str:
        scheme, _, token = (self.headers.get("Authorization") or "").partition(" ")
        return token.strip() if scheme.lower() == "bearer" and token.strip().startswith("sk_") else ""

    def do_GET(self):  # noqa: N802
        if self.path.split("?")[0] != "/v1/charges":
            return self._send(404, _error("invalid_request_error", f"unknown path {self.path}"))
        if not self._secret():
            return self._send(401, _error("invalid_request_error", "an sk_ bearer key is required"))
        with self.server.payments.lock:
            charges = list(reversed(self.server.payments.charges))
        self._send(200, {"object": "list", "data": charges, "has_more": False})

    def do_POST(self):  # noqa: N802
        length = min(int(self.headers.get("Content-Length") or 0), 1024 * 1024)
        raw = self.rfile.read(length).decode("utf-8", "replace") if length else ""
        if self.path != "/v1/charges":
            return self._send(404, _error("invalid_request_error", f"unknown path {self.path}"))
        secret = self._secret()
        if not secret:
            return self._send(401, _error("invalid_request_error", "an sk_ bearer key is required"))
        status, body, replayed = self.server.payments.charge(
            secret, self.headers.get("Idempotency-Key") or "", dict(parse_qsl(raw)))
        self._send(status, body, {"Idempotent-Replayed": "true"} if replayed else {})

    def _send(self, status: int, body: dict, headers: dict | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)


class PaymentsServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, host: str, port: int):
        super().__init__((host, port), _Handler)
        self.payments = Payments()


def main() -> None:
    parser = argparse.ArgumentParser(description=LABEL)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8091)
    options = parser.parse_args()
    server = PaymentsServer(options.host, options.port)
    print(f"{LABEL} on http://{options.host}:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
