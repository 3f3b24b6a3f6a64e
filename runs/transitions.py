"""Transitions: the only way a step ends. Every transition is a checkpoint boundary."""

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any


@dataclass(frozen=True)
class Transition:
    update: dict[str, Any] = field(default_factory=dict, kw_only=True)
    append: dict[str, list[Any]] = field(default_factory=dict, kw_only=True)


@dataclass(frozen=True)
class Goto(Transition):
    step: str


@dataclass(frozen=True)
class Finish(Transition):
    result: Any = None


@dataclass(frozen=True)
class Fail(Transition):
    reason: str


@dataclass(frozen=True)
class WaitForApproval(Transition):
    request: dict[str, Any]
    then: str
    timeout: timedelta | None = None
    on_timeout: str | None = None


@dataclass(frozen=True)
class WaitForEvent(Transition):
    kind: str
    key: str
    then: str
    timeout: timedelta | None = None
    on_timeout: str | None = None
    since: datetime | None = None  # match events received since then, if before the step began


@dataclass(frozen=True)
class Sleep(Transition):
    then: str
    until: datetime | None = None
    duration: timedelta | None = None


@dataclass(frozen=True)
class FanOut(Transition):
    step: str
    items: list[Any]
    then: str


@dataclass(frozen=True)
class RunChild(Transition):
    agent: str
    input: dict[str, Any]
    then: str
    version: int | None = None


def goto(step: str, update: dict | None = None, append: dict | None = None) -> Goto:
    return Goto(step, update=update or {}, append=append or {})


def finish(result: Any = None, update: dict | None = None, append: dict | None = None) -> Finish:
    return Finish(result, update=update or {}, append=append or {})


def fail(reason: str, update: dict | None = None, append: dict | None = None) -> Fail:
    return Fail(reason, update=update or {}, append=append or {})


def wait_for_approval(request: dict, *, then: str, timeout: timedelta | None = None,
                      on_timeout: str | None = None, update: dict | None = None,
                      append: dict | None = None) -> WaitForApproval:
    return WaitForApproval(request, then, timeout, on_timeout, update=update or {}, append=append or {})


def wait_for_event(kind: str, key: str, *, then: str, timeout: timedelta | None = None,
                   on_timeout: str | None = None, since: datetime | None = None,
                   update: dict | None = None, append: dict | None = None) -> WaitForEvent:
    """Park until an event (kind, key) arrives. Only events received since the step began
    count, or since `since` (timezone-aware) if that is earlier: an old event never wakes a
    new wait."""
    return WaitForEvent(kind, key, then, timeout, on_timeout, since, update=update or {},
                        append=append or {})


def sleep(*, then: str, until: datetime | None = None, duration: timedelta | None = None,
          update: dict | None = None) -> Sleep:
    if (until is None) == (duration is None):
        raise ValueError("sleep() takes exactly one of until= or duration=")
    return Sleep(then, until, duration, update=update or {})


def fan_out(step: str, items: list, *, then: str, update: dict | None = None) -> FanOut:
    return FanOut(step, list(items), then, update=update or {})


def stored(transition: Transition) -> list[Any]:
    """What of a transition is stored as JSON besides its `update` (the state, measured on its
    own): its appended values and the result, request, items, key or input it carries. (A
    `fail` reason is text, made storable where it is recorded.)"""
    match transition:
        case Finish(result=carried) | WaitForApproval(request=carried) | FanOut(items=carried):
            return [transition.append, carried]
        case WaitForEvent(kind=kind, key=key):
            return [transition.append, kind, key]
        case RunChild(agent=agent, input=carried, version=version):
            return [transition.append, agent, carried, version]
    return [transition.append]


def targets(transition: Transition) -> set[str]:
    """The steps a transition may lead to, checked against the step's declared `next`."""
    match transition:
        case Goto(step=step):
            return {step}
        case WaitForApproval(then=then, on_timeout=other) | WaitForEvent(then=then, on_timeout=other):
            return {then} | ({other} if other else set())
        case Sleep(then=then) | RunChild(then=then):
            return {then}
        case FanOut(step=step, then=then):
            return {step, then}
    return set()


def run_child(agent: str, input: dict | None = None, *, then: str, version: int | None = None,
              update: dict | None = None) -> RunChild:
    """Start a child run (a sub-agent) and wait for it; `then` sees state["event"]["payload"]
    with the child's status, result and error."""
    return RunChild(agent, input or {}, then, version, update=update or {})
