"""The dispatcher's port: what its tick needs from the layers above it. The watchdog asks the
runs core what became of runs it handed out; due timers are fired by the approvals inbox.
Dispatch sits at the bottom (the runs core puts runs in line through it), so it declares these
here and the composition root (agentplatform/apps.py) wires them once, at start-up."""

from collections.abc import Callable
from dataclasses import dataclass

from django.core.exceptions import ImproperlyConfigured


@dataclass(frozen=True)
class TickHandlers:
    # (rows, now) -> "requeue" | "drop" | "keep" per ready row, in the rows' tenant schema
    runs_inspect_in_flight: Callable[..., list[str]]
    # (run_id, visit) -> what happened; in the wakeup's tenant schema, in a transaction of its own
    wakeup_fire: Callable[..., str]


_wired: TickHandlers | None = None


def tick_handlers_wire(wired: TickHandlers) -> None:
    """Called once at start-up by the composition root."""
    global _wired
    _wired = wired


def tick_handlers() -> TickHandlers:
    if _wired is None:
        raise ImproperlyConfigured("the dispatcher's tick handlers are not wired: agentplatform."
                                   "apps.PlatformConfig (last in INSTALLED_APPS) wires them")
    return _wired
