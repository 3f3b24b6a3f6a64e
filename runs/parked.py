"""The runs core's port to the approvals inbox: what cancel, fork, resume and child reports
need done to a parked run's rows (its approvals, gates and wakeups). The inbox sits above the
runs core and calls its services, so the core declares what it needs here and the composition
root (agentplatform/apps.py) wires the inbox in once, at start-up. See decision 0011.

Every handler runs in the caller's transaction, with the run's row already locked.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agentplatform.wiring import Wiring


@dataclass(frozen=True)
class Inbox:
    approval_open: Callable[..., Any]  # (run, visit, request, then, on_timeout, timeout, kind=)
    gate_open: Callable[..., Any]  # (run, visit, kind, key, then, on_timeout, timeout, since=)
    wakeup_schedule: Callable[..., Any]  # (run_id, visit, due_at)
    wakeup_cancel: Callable[..., Any]  # (run_id): the run woke, its timer is void
    event_deliver: Callable[..., Any]  # (kind, key, source_id, payload): open gates take it
    parked_cancel: Callable[..., Any]  # (run_id): close approvals and gates, drop wakeups


inbox: Wiring[Inbox] = Wiring("the runs core's inbox")
inbox_wire = inbox.wire  # called once at start-up by the composition root
