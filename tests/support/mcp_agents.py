"""Operator test agents that call a tenant's MCP server through the ledger (tests/integrations/
test_mcp.py): one tool call, then a pause a test may kill the worker in."""

import time
from pathlib import Path

from runs.agents import Agent, RetryPolicy
from runs.transitions import finish

mcp_caller = Agent("mcp_caller", version=1, retry=RetryPolicy(max_attempts=3, initial_backoff=0.5))


@mcp_caller.step(start=True, next=[])
def search(ctx, state):
    result = ctx.effect("search", "mcp", credential=state.get("server", "docs"), tool="search",
                        arguments={"query": state["query"]})
    if marker := state.get("pause_while"):  # the window a test kills the worker in
        deadline = time.monotonic() + 30
        while Path(marker).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    return finish(result)
