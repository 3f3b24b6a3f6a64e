"""What a parked run waits for: the reason shown on the run, and the `waiting` its checkpoint
records (enough for a fork to open the same wait again)."""

from datetime import datetime

from django.utils import timezone

from ..transitions import FanOut, RunChild, Sleep, Transition, WaitForApproval, WaitForEvent
from .outcome import StepError


def park_reason(transition: Transition) -> tuple[str, datetime | None]:
    """The run's waiting reason for `transition`, and when a sleep is due."""
    match transition:
        case WaitForApproval(request=request):
            return f"approval: {request.get('title', 'requested')}", None
        case WaitForEvent(kind=kind, key=key):
            return f"event {kind}:{key}", None
        case Sleep(until=until, duration=duration):
            due = until or timezone.now() + duration
            return f"sleeping until {due.isoformat()}", due
        case RunChild(agent=agent):
            return f"child run of {agent}", None
        case FanOut(items=items):
            return f"fan_out: {len(items)} branches", None
    raise StepError(f"{type(transition).__name__} does not park a run")


def waiting_of(transition: Transition, due=None) -> dict:
    """What a run parked by `transition` waits for, as its checkpoint records it (`waiting`):
    enough for a fork to open the same wait again."""
    match transition:
        case WaitForApproval(request=request, then=then, on_timeout=on_timeout, timeout=timeout):
            request = dict(request)
            deciders = request.pop("deciders", [])
            return {"kind": "approval", "request": request, "deciders": deciders, "then": then,
                    "on_timeout": on_timeout,
                    "timeout": timeout.total_seconds() if timeout else None}
        case WaitForEvent(kind=kind, key=key, then=then, on_timeout=on_timeout, timeout=timeout):
            return {"kind": "event", "event_kind": kind, "key": key, "then": then,
                    "on_timeout": on_timeout,
                    "timeout": timeout.total_seconds() if timeout else None}
        case Sleep(then=then, duration=duration):
            return {"kind": "timer", "due": due.isoformat(), "then": then,
                    "duration": duration.total_seconds() if duration else None}
        case RunChild(agent=agent, input=input, then=then, version=version):
            return {"kind": "child_run", "agent": agent, "version": version, "input": input,
                    "then": then}
        case FanOut(step=step, items=items, then=then):
            return {"kind": "fan_out", "step": step, "items": items, "then": then}
    raise StepError(f"{type(transition).__name__} does not park a run")
