"""LangGraph on the platform, the one module a graph's author imports (docs/langgraph.md):

- `PlatformSaver`, `AsyncPlatformSaver`: a LangGraph checkpointer storing in the current
  tenant's schema (runs/graphs/saver.py); `Fence` fences its writes on a run's lease;
- `effect`, `model`: inside a node or `@task` of a graph registered with
  `Agent.from_langgraph`, an external call or a model call through the effect ledger, made
  once however often the task is re-run (runs/graphs/driver.py).
"""

from runs.graphs.driver import effect, model
from runs.graphs.saver import AsyncPlatformSaver, Fence, PlatformSaver

__all__ = ["AsyncPlatformSaver", "Fence", "PlatformSaver", "effect", "model"]
