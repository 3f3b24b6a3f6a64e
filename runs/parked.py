"""The runs core's port to the approvals inbox: what cancel, fork, resume and child reports
need done to a parked run's rows (its approvals, gates and wakeups). The inbox sits above the
runs core and calls its services, so the core declares what it needs here and the composition
root (agentplatform/apps.py) wires the inbox in once, at start-up. See decision 0011.

Every handler runs in the caller's transaction, with the run's row already locked.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ImproperlyConfigured


@dataclass(frozen=True)
class Inbox:
    approval_open: Callable[..., Any]  # (run, visit, request, then, on_timeout, timeout, kind=)
    gate_open: Callable[..., Any]  # (run, visit, kind, key, then, on_timeout, timeout, since=)
    wakeup_schedule: Callable[..., Any]  # (run_id, visit, due_at)
    wakeup_cancel: Callable[..., Any]  # (run_id): the run woke, its timer is void
    event_deliver: Callable[..., Any]  # (kind, key, source_id, payload): open gates take it
    parked_cancel: Callable[..., Any]  # (run_id): close approvals and gates, drop wakeups


_wired: Inbox | None = None


def inbox_wire(wired: Inbox) -> None:
    """Called once at start-up by the composition root."""
    global _wired
    _wired = wired


def inbox() -> Inbox:
    if _wired is None:
        raise ImproperlyConfigured("the runs core's inbox is not wired: agentplatform.apps."
                                   "PlatformConfig (last in INSTALLED_APPS) wires it in ready()")
    return _wired
