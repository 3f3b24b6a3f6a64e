"""A fake Stripe: `POST /v1/charges` with Stripe's Idempotency-Key semantics.

- same key, same parameters, first request finished: the stored status and body again, with
  `Idempotent-Replayed: true` (errors such as a decline are stored and replayed too);
- same key, different parameters: 400 `idempotency_error`;
- same key while the first request is still executing: 409 `idempotency_error`
  (`idempotency_key_in_use`), nothing stored;
- parameters that fail validation: 400 `invalid_request_error`, nothing stored.
Keys are scoped to the secret key (Stripe's account). `source=tok_chargeDeclined` is declined
(402 card_error). Knobs: `delay` (seconds between making the charge and answering),
`unavailable_next` (that many 503s before anything executes), `drop_next` (that many requests
executed whose answer is never sent).
"""

import secrets
import time
from typing import Any
from urllib.parse import parse_qsl

from . import DROP, FakeServer, bearer

IN_PROGRESS = object()


class FakeStripe(FakeServer):
    name = "stripe"
    configurable = ("delay", "unavailable_next", "drop_next")

    def reset(self) -> None:
        with self.lock:
            self.charges: list[dict[str, Any]] = []
            self.keys: dict[tuple[str, str], Any] = {}  # (secret key, idempotency key) -> stored
            self.requests = self.replays = self.conflicts = 0
            self.delay, self.unavailable_next, self.drop_next = 0.0, 0, 0

    def state(self) -> dict[str, Any]:
        with self.lock:
            succeeded = len(self.succeeded())
            return {"charges": succeeded, "charges_failed": len(self.charges) - succeeded,
                    "requests": self.requests, "replays": self.replays, "conflicts": self.conflicts,
                    "charges_by_key": self.charges_by_key()}

    def succeeded(self) -> list[dict[str, Any]]:
        with self.lock:
            return [c for c in self.charges if c["status"] == "succeeded"]

    def charges_by_key(self) -> dict[str, int]:
        with self.lock:
            counts: dict[str, int] = {}
            for charge in self.charges:
                counts[charge["_idempotency_key"]] = counts.get(charge["_idempotency_key"], 0) + 1
            return counts

    def handle(self, method, path, query, headers, raw):
        with self.lock:
            self.requests += 1
        if not bearer(headers).startswith("sk_"):
            return _error(401, "invalid_request_error", "Invalid API Key provided.")
        if (method, path) != ("POST", "/v1/charges"):
            return _error(404, "invalid_request_error", f"Unrecognized request URL ({method}: {path}).")
        params = parse_qsl(raw.decode(), keep_blank_values=True)
        fingerprint = tuple(sorted(params))
        key = (headers.get("Idempotency-Key") or "").strip()
        if len(key) > 255:
            return _error(400, "invalid_request_error", "Idempotency-Key is longer than 255 characters.")
        scope = (bearer(headers), key)
        with self.lock:
            if self.unavailable_next > 0:
                self.unavailable_next -= 1
                return _error(503, "api_error", "Stripe is temporarily unavailable.")
            stored = self.keys.get(scope) if key else None
            if stored is IN_PROGRESS:
                self.conflicts += 1
                return _error(409, "idempotency_error",
                              "There is currently another in-progress request using this Idempotent "
                              "Key (that probably means you submitted twice, and the other request "
                              f"is still going through): {key}. Please try again later.",
                              code="idempotency_key_in_use", should_retry=True)
            if stored is not None:
                if stored["fingerprint"] != fingerprint:
                    return _error(400, "idempotency_error",
                                  "Keys for idempotent requests can only be used with the same "
                                  "parameters they were first used with. Try using a key other "
                                  f"than '{key}' if you meant to execute a different request.")
                self.replays += 1
                return stored["status"], stored["body"], {"Idempotent-Replayed": "true",
                                                          "Idempotency-Key": key}
            invalid = _validate(dict(params))
            if invalid:
                return _error(400, "invalid_request_error", invalid[1], param=invalid[0])
            if key:
                self.keys[scope] = IN_PROGRESS
            drop = self.drop_next > 0
            self.drop_next -= 1 if drop else 0
            delay = self.delay
        try:
            status, body = self._charge(dict(params), key)
            if delay:
                time.sleep(delay)
        except BaseException:
            with self.lock:
                self.keys.pop(scope, None)
            raise
        if key:
            with self.lock:
                self.keys[scope] = {"fingerprint": fingerprint, "status": status, "body": body}
        if drop:
            return DROP, None, {}
        return status, body, {"Idempotency-Key": key} if key else {}

    def _charge(self, params: dict[str, str], key: str) -> tuple[int, dict]:
        declined = params.get("source") == "tok_chargeDeclined"
        charge = {
            "id": f"ch_{secrets.token_hex(12)}", "object": "charge", "amount": int(params["amount"]),
            "currency": params["currency"].lower(), "created": int(time.time()),
            "status": "failed" if declined else "succeeded", "paid": not declined, "captured": not declined,
            "description": params.get("description"), "livemode": False,
            "metadata": {k[9:-1]: v for k, v in params.items() if k.startswith("metadata[")},
            "failure_code": "card_declined" if declined else None,
        }
        with self.lock:
            self.charges.append({**charge, "_idempotency_key": key})
        if declined:
            return 402, {"error": {"type": "card_error", "code": "card_declined",
                                   "decline_code": "generic_decline", "charge": charge["id"],
                                   "message": "Your card was declined."}}
        return 200, charge


def _validate(params: dict[str, str]) -> tuple[str, str] | None:
    amount = params.get("amount", "")
    if not amount.isdigit() or int(amount) <= 0:
        return "amount", "Invalid positive integer"
    if not params.get("currency"):
        return "currency", "Missing required param: currency."
    if not (params.get("source") or params.get("customer")):
        return "source", "You must supply either a source or a customer id"
    return None


def _error(status: int, kind: str, message: str, *, code: str | None = None, param: str | None = None,
           should_retry: bool | None = None) -> tuple[int, dict, dict]:
    error = {"type": kind, "message": message}
    if code:
        error["code"] = code
    if param:
        error["param"] = param
    headers = {} if should_retry is None else {"Stripe-Should-Retry": str(should_retry).lower()}
    return status, {"error": error}, headers


if __name__ == "__main__":
    FakeStripe.main()
