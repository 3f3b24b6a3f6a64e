"""The scripted model server: a DEVELOPMENT AND TEST STAND-IN for a model provider, not a model.

It speaks the Chat Completions wire format (`POST /v1/chat/completions`, bearer key) so the
platform's `model` connector talks to it exactly as to a hosted provider, vLLM or llama.cpp's
server, and it answers from a script instead of thinking. Every answer says so: its
`system_fingerprint` is "scripted-model-server, not a model" and its id starts `scripted-`.
Standard library only (no Django), so it runs anywhere:

    python -m integrations.scripted_model --port 8090 --script demo/script.json

A script file is `{"scripts": {"<model name>": [<turn>, ...]}}`. The request's `model` picks the
script, and the turn played is the number of assistant messages already in the conversation:
the same conversation always gets the same reply (stateless, so a request repeated after a
crash is answered the same way). A turn is one of

    {"content": "Paid {{tool.pay.id}}."}
    {"tool_calls": [{"name": "pay", "arguments": {"amount": "{{input.invoice.amount}}"}}]}

optionally with `"delay_seconds": 2` (answer late: tests interrupt a call in flight) and, on the
last turn, `"repeat": true` (play it again for every later turn: a model that loops). Strings
anywhere in a turn may use `{{input.<path>}}` (the first user message, parsed as JSON) and
`{{tool.<tool name>.<path>}}` (the latest result of that tool, parsed as JSON); a string that is
exactly one placeholder takes the value itself (a number stays a number), otherwise the value
is written into the text. A placeholder that finds nothing becomes "" (or null, alone).

Also: `GET /v1/state` (request counts: in all, per model, per turn, per Idempotency-Key),
`POST /v1/script` (replace the scripts: the body is a script file), `POST /v1/reset` (counts to
zero), `GET /v1/models`. A turn beyond the script's end is a 400 that says so.
"""

import argparse
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

FINGERPRINT = "scripted-model-server, not a model"
PLACEHOLDER = re.compile(r"\{\{\s*(input|tool)\.([A-Za-z0-9_.\-]+?)\s*\}\}")
MAX_BODY_BYTES = 16 * 1024 * 1024


class ScriptError(ValueError):
    """A script that cannot be played: what is wrong, for the person who wrote it."""


def scripts_check(document: Any) -> dict[str, list[dict]]:
    """The scripts of a script file, or ScriptError naming the first problem."""
    if not isinstance(document, dict) or not isinstance(document.get("scripts"), dict):
        raise ScriptError('a script file is {"scripts": {"<model name>": [<turn>, ...]}}')
    for model, turns in document["scripts"].items():
        if not isinstance(turns, list) or not turns:
            raise ScriptError(f"scripts[{model!r}] must be a non-empty list of turns")
        for index, turn in enumerate(turns):
            where = f"scripts[{model!r}][{index}]"
            if not isinstance(turn, dict) or not ({"content", "tool_calls"} & set(turn)):
                raise ScriptError(f'{where} must be {{"content": ...}} or {{"tool_calls": [...]}}')
            unknown = set(turn) - {"content", "tool_calls", "delay_seconds", "repeat"}
            if unknown:
                raise ScriptError(f"{where} has unknown fields {sorted(unknown)}")
            for call_index, call in enumerate(turn.get("tool_calls") or []):
                if not isinstance(call, dict) or not isinstance(call.get("name"), str):
                    raise ScriptError(f"{where}.tool_calls[{call_index}] needs a name")
                if not isinstance(call.get("arguments", {}), dict):
                    raise ScriptError(f"{where}.tool_calls[{call_index}].arguments must be an object")
            if turn.get("repeat") and index != len(turns) - 1:
                raise ScriptError(f"{where}: only the last turn may repeat")
    return document["scripts"]


def _json_or_none(text: Any) -> Any:
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return None


def _context(messages: list[dict]) -> dict[str, Any]:
    """What placeholders read: the input (first user message) and each tool's latest result."""
    first_user = next((m for m in messages if m.get("role") == "user"), {})
    names: dict[str, str] = {}  # tool_call_id -> tool name, from the assistant's calls
    for message in messages:
        for call in message.get("tool_calls") or []:
            if isinstance(call, dict):
                names[str(call.get("id"))] = str((call.get("function") or {}).get("name"))
    tools: dict[str, Any] = {}
    for message in messages:
        if message.get("role") == "tool":
            name = message.get("name") or names.get(str(message.get("tool_call_id")), "")
            tools[name] = _json_or_none(message.get("content"))
    return {"input": _json_or_none(first_user.get("content")), "tool": tools}


def _lookup(value: Any, path: str) -> Any:
    for part in path.split("."):
        if isinstance(value, dict):
            value = value.get(part)
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return None
    return value


def _fill(template: Any, context: dict) -> Any:
    if isinstance(template, dict):
        return {key: _fill(value, context) for key, value in template.items()}
    if isinstance(template, list):
        return [_fill(value, context) for value in template]
    if not isinstance(template, str):
        return template
    whole = PLACEHOLDER.fullmatch(template.strip())
    if whole:
        return _lookup(context[whole.group(1)], whole.group(2))

    def text(match):
        value = _lookup(context[match.group(1)], match.group(2))
        if value is None:
            return ""
        return value if isinstance(value, str) else json.dumps(value, sort_keys=True)

    return PLACEHOLDER.sub(text, template)


def _tokens(messages: list[dict]) -> int:
    """A token is a whitespace-separated word (plus 3 per message): enough for budgets."""
    return sum(len(str(m.get("content") or "").split()) + 3 for m in messages)


class ScriptedModel:
    """The scripts and the counts; `answer` is the whole protocol, the HTTP layer only wraps it."""

    def __init__(self, scripts: dict[str, list[dict]] | None = None):
        self.lock = threading.Lock()
        self.scripts = scripts_check({"scripts": scripts or {}}) if scripts else {}
        self.reset()

    def reset(self) -> None:
        with self.lock:
            self.requests = 0
            self.by_model: dict[str, int] = {}
            self.by_turn: dict[str, int] = {}  # "<model>:<turn>" -> requests
            self.by_key: dict[str, int] = {}  # Idempotency-Key -> requests

    def script_set(self, document: Any) -> None:
        scripts = scripts_check(document)
        with self.lock:
            self.scripts = scripts

    def state(self) -> dict[str, Any]:
        with self.lock:
            return {"server": FINGERPRINT, "requests": self.requests, "by_model": dict(self.by_model),
                    "by_turn": dict(self.by_turn), "by_key": dict(self.by_key),
                    "models": sorted(self.scripts)}

    def answer(self, request: Any, *, key: str = "") -> tuple[int, dict, float]:
        """(status, body, seconds to wait before answering) for one chat-completion request."""
        if not isinstance(request, dict) or not isinstance(request.get("messages"), list) \
                or not request["messages"] or not isinstance(request.get("model"), str):
            return _error(400, "'model' and a non-empty 'messages' list are required")
        model, messages = request["model"], request["messages"]
        if not all(isinstance(m, dict) for m in messages):
            return _error(400, "each message must be an object")
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        with self.lock:
            turns = self.scripts.get(model)
            self.requests += 1
            self.by_model[model] = self.by_model.get(model, 0) + 1
            self.by_turn[f"{model}:{turn}"] = self.by_turn.get(f"{model}:{turn}", 0) + 1
            if key:
                self.by_key[key] = self.by_key.get(key, 0) + 1
        if turns is None:
            return _error(404, f"the scripted model server has no script for model {model!r} "
                               f"(it has {sorted(self.scripts)})", code="model_not_found")
        if turn >= len(turns) and not turns[-1].get("repeat"):
            return _error(400, f"the script for {model!r} has {len(turns)} turns; this conversation "
                               f"asks for turn {turn + 1}")
        played = turns[min(turn, len(turns) - 1)]
        context = _context(messages)
        message: dict[str, Any] = {"role": "assistant", "content": None}
        if "content" in played:
            content = _fill(played["content"], context)
            message["content"] = content if isinstance(content, str) or content is None \
                else json.dumps(content, sort_keys=True)
        calls = [{"id": f"call_{turn}_{index}", "type": "function",
                  "function": {"name": call["name"],
                               "arguments": json.dumps(_fill(call.get("arguments", {}), context),
                                                       sort_keys=True)}}
                 for index, call in enumerate(played.get("tool_calls") or [])]
        if calls:
            message["tool_calls"] = calls
        prompt = _tokens(messages)
        completion = len(str(message["content"] or "").split()) + 10 * len(calls)
        body = {
            "id": f"scripted-{model}-{turn}", "object": "chat.completion", "created": int(time.time()),
            "model": model, "system_fingerprint": FINGERPRINT,
            "choices": [{"index": 0, "message": message, "logprobs": None,
                         "finish_reason": "tool_calls" if calls else "stop"}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                      "total_tokens": prompt + completion},
        }
        return 200, body, float(played.get("delay_seconds") or 0)


def _error(status: int, message: str, code: str | None = None) -> tuple[int, dict, float]:
    return status, {"error": {"message": f"scripted-model-server: {message}",
                              "type": "invalid_request_error", "param": None, "code": code}}, 0.0


class _Handler(BaseHTTPRequestHandler):
    server: "ScriptedModelServer"
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):  # noqa: A002  (quiet: callers read /v1/state)
        pass

    def do_GET(self):  # noqa: N802
        model = self.server.model
        if self.path == "/v1/state":
            return self._send(200, model.state())
        if self.path == "/v1/models":
            names = model.state()["models"]
            return self._send(200, {"object": "list", "data": [
                {"id": name, "object": "model", "owned_by": FINGERPRINT} for name in names]})
        return self._send(404, _error(404, f"unknown path {self.path}")[1])

    def do_POST(self):  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY_BYTES:
            self.close_connection = True
            return self._send(413, _error(413, "request too large")[1])
        raw = self.rfile.read(length) if length else b""
        request = _json_or_none(raw.decode("utf-8", "replace"))
        model = self.server.model
        if self.path == "/v1/reset":
            model.reset()
            return self._send(200, {"ok": True})
        if self.path == "/v1/script":
            try:
                model.script_set(request)
            except ScriptError as exc:
                return self._send(400, _error(400, str(exc))[1])
            return self._send(200, {"ok": True, "models": model.state()["models"]})
        if self.path != "/v1/chat/completions":
            return self._send(404, _error(404, f"unknown path {self.path}")[1])
        scheme, _, token = (self.headers.get("Authorization") or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return self._send(401, _error(401, "a bearer API key is required (any value)",
                                          code="invalid_api_key")[1])
        status, body, delay = model.answer(request, key=self.headers.get("Idempotency-Key") or "")
        if delay:
            time.sleep(delay)
        self._send(status, body)

    def _send(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        try:
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the caller died waiting (tests kill it)
            pass


class ScriptedModelServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, model: ScriptedModel, host: str = "127.0.0.1", port: int = 0):
        super().__init__((host, port), _Handler)
        self.model = model
        self.url = f"http://{host}:{self.server_address[1]}"


def server_start(scripts: dict | None = None, *, host: str = "127.0.0.1", port: int = 0
                 ) -> ScriptedModelServer:
    """Serve in a thread of this process (tests); `shutdown()` + `server_close()` stop it."""
    server = ScriptedModelServer(ScriptedModel(scripts), host, port)
    threading.Thread(target=server.serve_forever, name="scripted-model", daemon=True).start()
    return server


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="The scripted model server: a development and "
                                     "test stand-in for a Chat Completions provider, not a model.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8090)
    parser.add_argument("--script", help="a JSON file {\"scripts\": {\"<model>\": [<turn>, ...]}}")
    options = parser.parse_args(argv)
    model = ScriptedModel()
    if options.script:
        with open(options.script, encoding="utf-8") as file:
            try:
                model.script_set(json.load(file))
            except (ValueError, ScriptError) as exc:
                parser.error(f"{options.script}: {exc}")
    server = ScriptedModelServer(model, options.host, options.port)
    print(f"scripted model server (a test stand-in, not a model) on {server.url}/v1 "
          f"with scripts for {sorted(model.scripts)}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
