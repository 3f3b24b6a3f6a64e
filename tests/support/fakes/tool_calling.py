"""A Chat Completions stand-in for the dashboard's tests of tenant agents: the first turn calls
the tool `pay` (amount 42), every later turn answers at length (to be cut on the page). The
project's scripted model server (integrations/scripted_model.py) plays any script; this one
plays only that, with no file to write."""

import json
from typing import Any

from . import FakeServer

LONG_ANSWER = "Paid. " + "All details follow. " * 100


class ToolCallingModel(FakeServer):
    name = "tool-model"

    def reset(self) -> None:
        with self.lock:
            self.requests = 0

    def state(self) -> dict[str, Any]:
        with self.lock:
            return {"requests": self.requests}

    def handle(self, method, path, query, headers, raw):
        with self.lock:
            self.requests += 1
        turns = sum(1 for m in json.loads(raw)["messages"] if m["role"] == "assistant")
        if turns == 0:
            arguments = {"amount": 42, "currency": "EUR", "customer": "cus_1"}
            message = {"role": "assistant", "content": None, "tool_calls": [{
                "id": "call_pay_1", "type": "function",
                "function": {"name": "pay", "arguments": json.dumps(arguments)}}]}
            finish = "tool_calls"
        else:
            message, finish = {"role": "assistant", "content": LONG_ANSWER}, "stop"
        return 200, {"id": "chatcmpl-tool", "object": "chat.completion", "model": "m",
                     "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                     "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20}}, {}
