"""LangGraph on the platform: a checkpointer (`saver.py`) that stores a graph's checkpoints in
the current tenant's schema, list channels as appended suffixes, every write fenced when a
platform run holds the thread; and the driver (`driver.py`) that runs a compiled graph as a
platform agent, superstep by superstep under the run's lease."""
