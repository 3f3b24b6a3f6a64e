"""A fake webhook receiver that does what we ask of receivers: verify the signature, and act
once per Idempotency-Key (a repeat gets the first answer again, marked `"duplicate": true`).

`signing_secret` is the secret it checks with (configurable). Knobs: `failing_next` (500s before
acting), `drop_next` (act, then never answer).
"""

import json
from typing import Any

from integrations.connectors.webhook import SIGNATURE_HEADER, signature_verify

from . import DROP, FakeServer


class FakeWebhook(FakeServer):
    name = "webhook"
    configurable = ("signing_secret", "failing_next", "drop_next")

    def reset(self) -> None:
        with self.lock:
            self.deliveries: list[dict[str, Any]] = []  # every request that reached it
            self.events: dict[str, Any] = {}  # idempotency key -> payload: what it acted on
            self.rejected = 0
            self.signing_secret = getattr(self, "signing_secret", "whsec_test")
            self.failing_next = self.drop_next = 0

    def state(self) -> dict[str, Any]:
        with self.lock:
            return {"deliveries": len(self.deliveries), "acted": len(self.events),
                    "rejected": self.rejected,
                    "deliveries_by_key": self.deliveries_by_key()}

    def deliveries_by_key(self) -> dict[str, int]:
        with self.lock:
            counts: dict[str, int] = {}
            for delivery in self.deliveries:
                counts[delivery["key"]] = counts.get(delivery["key"], 0) + 1
            return counts

    def handle(self, method, path, query, headers, raw):
        key = headers.get("Idempotency-Key") or ""
        with self.lock:
            self.deliveries.append({"path": path, "key": key, "headers": dict(headers.items()),
                                    "body": raw})
            if not signature_verify(self.signing_secret, headers.get(SIGNATURE_HEADER) or "", raw):
                self.rejected += 1
                return 401, {"error": "bad signature"}, {}
            if self.failing_next > 0:
                self.failing_next -= 1
                return 500, {"error": "receiver failed"}, {}
            duplicate = key in self.events
            if not duplicate:
                self.events[key] = json.loads(raw)
            drop = self.drop_next > 0
            self.drop_next -= 1 if drop else 0
        if drop:
            return DROP, None, {}
        return 200, {"received": True, "duplicate": duplicate}, {}


if __name__ == "__main__":
    FakeWebhook.main()
