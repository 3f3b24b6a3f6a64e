"""The dispatcher's port: what its tick needs from the layers above it. The watchdog asks the
runs core what became of runs it handed out; due timers are fired by the approvals inbox.
Dispatch sits at the bottom (the runs core puts runs in line through it), so it declares these
here and the composition root (agentplatform/apps.py) wires them once, at start-up."""

from collections.abc import Callable
from dataclasses import dataclass

from agentplatform.wiring import Wiring


@dataclass(frozen=True)
class TickHandlers:
    # (rows, now) -> "requeue" | "drop" | "keep" per ready row, in the rows' tenant schema
    runs_inspect_in_flight: Callable[..., list[str]]
    # (run_id, visit) -> what happened; in the wakeup's tenant schema, in a transaction of its own
    wakeup_fire: Callable[..., str]


tick_handlers: Wiring[TickHandlers] = Wiring("the dispatcher's tick handlers")
tick_handlers_wire = tick_handlers.wire  # called once at start-up by the composition root
