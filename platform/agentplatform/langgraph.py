"""LangGraph on the platform, the one module a graph's author imports: `PlatformSaver` and
`AsyncPlatformSaver`, a LangGraph checkpointer storing in a tenant's schema, and `Fence`, which
fences its writes on a platform run's lease (runs/graphs/saver.py)."""

from runs.graphs.saver import AsyncPlatformSaver, Fence, PlatformSaver

__all__ = ["AsyncPlatformSaver", "Fence", "PlatformSaver"]
