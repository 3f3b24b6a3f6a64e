"""The engine's ports: what it needs from the apps that plug into it (effects, sandboxes,
parking), declared here and wired once at start-up by the composition root
(agentplatform/apps.py). Also the building blocks the engine shares with them: the errors an
effect raises into a step, an effect's `Scope`, and `idempotency_key`.
"""

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from uuid import UUID

from django.core.exceptions import ImproperlyConfigured

from agentplatform.wiring import Wiring


class EffectError(Exception):
    """Raised into the step: the step's retry policy decides what happens next. `maybe_sent`:
    the failed attempt may have reached the receiver (it may have acted)."""

    def __init__(self, message: str = "", *, maybe_sent: bool = False):
        super().__init__(message)
        self.maybe_sent = maybe_sent


class EffectRefused(EffectError):
    """Not retryable: the step broke a rule of the ledger or the receiver said no for good."""


class NeedsPerson(Exception):
    """The run must park until a person decides; the engine turns this into an approval."""

    def __init__(self, kind: str, request: dict):
        super().__init__(request.get("title", kind))
        self.kind, self.request = kind, request


class BudgetExceeded(Exception):
    def __init__(self, message: str):
        super().__init__(message)


@dataclass(frozen=True)
class Scope:
    """Where an effect happens: which run, which step visit (or branch), under which lease."""

    run_id: UUID
    key: str  # "7" or "7/b3"
    epoch: int  # the run's lease epoch, or the branch's own when `branch` is set
    branch: int | None = None  # a fan-out branch's index: fenced on that branch's lease


def idempotency_key(*, schema: str, run_id: UUID, scope: str, name: str) -> str:
    return hashlib.sha256(f"{schema}:{run_id}:{scope}:{name}".encode()).hexdigest()[:48]


class EffectPerform(Protocol):
    """Run an effect once (the ledger); raises the effect errors above."""

    def __call__(self, *, scope: Scope, name: str, connector: str, args: dict,
                 budget_check: Callable[[], None] | None = None,
                 credential: str = "default") -> Any: ...


class BudgetChecker(Protocol):
    """A check run before a model call: raises BudgetExceeded if it would exceed a budget."""

    def __call__(self, *, run_id: UUID, requested_tokens: int) -> Callable[[], None]: ...


class SandboxSession(Protocol):
    """`ctx.sandbox` for one attempt of one step; durable once the step completes."""

    def step_completed(self) -> None: ...


class SandboxSessionFactory(Protocol):
    def __call__(self, *, run_id: UUID, visit: int, scope: str | None = None) -> SandboxSession: ...


# The handlers for transitions that park a run (and for a run parked for a person, or a child
# run that ended), each called in the parking transaction with the keyword arguments below.
PARKING_KINDS = frozenset({
    "approval",      # approval_open(run, visit, request, then, on_timeout, timeout, kind=...)
    "event_gate",    # gate_open(run, visit, kind, key, then, on_timeout, timeout, since=...)
    "timer",         # wakeup_schedule(run_id, visit, due_at)
    "child_run",     # run_start(agent, version, input, parent_id, durability) -> .run
    "child_report",  # child_report(run_id, status, result, error): wake the waiting parent
})


@dataclass(frozen=True)
class Ports:
    effect_perform: EffectPerform
    # Park for a person an effect whose last attempt may have been sent (raises NeedsPerson).
    effect_outcome_unknown: Callable[..., Any]
    budget_checker: BudgetChecker
    outbox_kick: Callable[[], None]  # ring the outbox deliverer once the caller commits
    sandbox_session: SandboxSessionFactory
    parking: Mapping[str, Callable[..., Any]]  # keyed by PARKING_KINDS


ports: Wiring[Ports] = Wiring("the engine's ports")


def ports_wire(wired: Ports) -> None:
    """Called once at start-up by the composition root."""
    missing = PARKING_KINDS - set(wired.parking)
    if missing:
        raise ImproperlyConfigured(f"the engine's parking handlers miss {sorted(missing)}")
    ports.wire(wired)
