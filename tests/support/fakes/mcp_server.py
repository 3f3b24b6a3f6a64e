"""A local MCP server for tests, built with the `mcp` package (MCPServer over streamable HTTP),
runnable as a subprocess: `python -m tests.support.fakes.mcp_server --port N [--token T]`.

Tools: `search(query, limit=3)` (structured results), `echo(text)` (text) and `fail(reason)`
(a tool error: isError). Every call is counted per tool, with its arguments, the `_meta` it
carried and its Authorization header, when it arrives (before any delay). Like the HTTP fakes:
`GET /_fake/state`, `POST /_fake/reset`, `POST /_fake/config` ({"delay": seconds}: each tool
call waits that long before answering). With `--token`, every MCP request must carry
`Authorization: Bearer <token>` (401 otherwise). `mcp_process.McpServerProcess` runs one for a
test; the MCP endpoint is `/mcp`.
"""

import argparse
import asyncio
import threading
from typing import Any

import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.transport_security import TransportSecuritySettings
from starlette.requests import Request
from starlette.responses import JSONResponse

DOCUMENTS = {"durable": "Runs resume where they stopped.", "ledger": "Effects happen once.",
             "tenants": "One schema per tenant."}

lock = threading.Lock()
calls: dict[str, list[dict]] = {}
seen: list[dict] = []  # per call: tool, _meta, authorization
config = {"delay": 0.0}

server = MCPServer("agentplatform-test-docs", instructions="A test server: documents to search.")


def _arrived(tool: str, arguments: dict, ctx: Context) -> float:
    context = ctx.request_context
    meta = context.meta
    if meta is not None and not isinstance(meta, dict):
        meta = meta.model_dump(by_alias=True, exclude_none=True)
    request = context.request
    authorization = request.headers.get("authorization", "") if request is not None else ""
    with lock:
        calls.setdefault(tool, []).append(arguments)
        seen.append({"tool": tool, "meta": meta or {}, "authorization": authorization,
                     "header": request.headers.get("x-docs-tenant", "") if request else ""})
        return float(config["delay"])


@server.tool(description="Search the documents; results by relevance.")
async def search(query: str, ctx: Context, limit: int = 3) -> dict[str, Any]:
    delay = _arrived("search", {"query": query, "limit": limit}, ctx)
    await asyncio.sleep(delay)
    hits = [{"id": key, "text": text} for key, text in DOCUMENTS.items()
            if query.lower() in (key + " " + text).lower()]
    return {"query": query, "hits": hits[:limit]}


@server.tool(description="Say the text back.")
async def echo(text: str, ctx: Context) -> str:
    delay = _arrived("echo", {"text": text}, ctx)
    await asyncio.sleep(delay)
    return f"echo: {text}"


@server.tool(description="Always fails (a tool error, not a protocol error).")
async def fail(reason: str, ctx: Context) -> str:
    _arrived("fail", {"reason": reason}, ctx)
    raise ValueError(f"failed as asked: {reason}")


@server.custom_route("/_fake/state", methods=["GET"])
async def state(request: Request) -> JSONResponse:
    with lock:
        return JSONResponse({"calls": calls, "seen": seen,
                             "count": sum(len(made) for made in calls.values())})


@server.custom_route("/_fake/reset", methods=["POST"])
async def reset(request: Request) -> JSONResponse:
    with lock:
        calls.clear()
        seen.clear()
        config["delay"] = 0.0
    return JSONResponse({"ok": True})


@server.custom_route("/_fake/config", methods=["POST"])
async def configure(request: Request) -> JSONResponse:
    changes = await request.json()
    with lock:
        config.update({key: float(value) for key, value in changes.items() if key in config})
    return JSONResponse({"ok": True})


def app(token: str = ""):
    # host checks off: tests reach it under other names (pinned to 127.0.0.1)
    starlette_app = server.streamable_http_app(
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False))
    if not token:
        return starlette_app

    async def guarded(scope, receive, send):
        if scope["type"] == "http" and scope["path"].startswith("/mcp"):
            headers = dict(scope.get("headers") or [])
            if headers.get(b"authorization", b"").decode() != f"Bearer {token}":
                response = JSONResponse({"error": "unauthorized"}, status_code=401)
                return await response(scope, receive, send)
        return await starlette_app(scope, receive, send)

    return guarded


def main() -> None:
    parser = argparse.ArgumentParser(description="A local MCP server for tests")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--token", default="")
    options = parser.parse_args()
    uvicorn.run(app(options.token), host="127.0.0.1", port=options.port, log_level="warning")


if __name__ == "__main__":
    main()
