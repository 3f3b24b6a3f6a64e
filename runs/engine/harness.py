"""The step loop (`Harness`): runs one claimed run's steps, checkpoints each transition, and
ends the run or parks it as rows when it waits."""

import inspect
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from types import TracebackType
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone
from opentelemetry import trace

from agentplatform.errors import ServiceError
from agentplatform.metrics import run_finished_count, step_duration
from agentplatform.redaction import secrets_redact
from agentplatform.storable import Unstorable, json_dumped, json_storable
from agentplatform.telemetry import span_start
from runs.dispatch.services import ready_clear, ready_mark, ready_requeue

from ..agents import Agent, Step
from ..approvals.models import EventGate
from ..effects.models import OutboxMessage
from ..events import event_record, event_row
from ..models import Branch, Checkpoint, Run
from ..state import LogView, State, StateTooLarge, state_merge_dumped
from ..transitions import (
    Fail,
    FanOut,
    Finish,
    Goto,
    RunChild,
    Sleep,
    Transition,
    WaitForApproval,
    WaitForEvent,
    stored,
    targets,
)
from .context import INTERRUPTS, StepContext
from .outcome import ChildRunRefused, Outcome, StepError
from .parking import park_reason, waiting_of
from .ports import BudgetExceeded, EffectRefused, NeedsPerson, idempotency_key, ports
from .writer import CheckpointWriter, Position, position_load

tracer = trace.get_tracer("agentplatform.runs")

TRACEBACK_MAX_FRAMES = 20
TRACEBACK_MAX_CHARS = 4000

CANCEL_POLL_SECONDS = 0.5


class Harness:
    """Runs one claimed run's steps until it parks, ends, or its time slice is used."""

    def __init__(self, run: Run, agent: Agent, epoch: int, owner: str, slice_seconds: float,
                 sleep=time.sleep, latest: Checkpoint | None = None,
                 on_leave: Callable[[], object] | None = None):
        self.run, self.agent, self.epoch, self.owner = run, agent, epoch, owner
        self.latest = latest  # the run's newest checkpoint, if the claim read it
        self.on_leave = on_leave
        self.slice_seconds = slice_seconds
        self.sleep = sleep
        self.writer = CheckpointWriter(run, epoch)
        self.writer.cancel_requested = run.cancel_requested
        self.item, self.branch = None, None  # set when running a fan-out branch (its row)
        self.notifications: list[dict] = []  # the last successful step's ctx.notify calls

    def go(self) -> Outcome:
        try:
            return self._loop()
        finally:
            self.writer.close()

    def _loop(self) -> Outcome:
        run, agent = self.run, self.agent
        position = self.position = position_load(run=run, checkpoint=self.latest)
        logs = {
            name: LogView(run.id, name, lambda name=name: self.position.offsets.get(name, 0),
                          self.writer.unwritten_values)
            for name in agent.logs
        }
        slice_started = time.monotonic()
        while True:
            if self._cancel_requested():
                return self._end(position, Run.Status.CANCELLED, event="run_cancelled")
            if run.steps_taken >= run.max_steps:
                return self._end(position, Run.Status.FAILED, event="limit_exceeded",
                                 error=f"max_steps reached: {run.steps_taken} of {run.max_steps}")
            if run.active_seconds >= run.max_wall_seconds:
                return self._end(position, Run.Status.FAILED, event="limit_exceeded",
                                 error=f"max wall time reached: {run.active_seconds:.1f}s of "
                                       f"{run.max_wall_seconds:.1f}s")
            step = agent.steps[position.step]
            started, self.step_started = time.monotonic(), time.time()  # not timezone.now(): 3 µs
            try:
                transition = self.step_run(step, position, logs)
                if transition is None:  # retries exhausted; the errors are in the events
                    return self._end(position, Run.Status.FAILED, error=self.last_error)
                position = self.position = self._apply(step, position, transition)
            except StepError as exc:
                event_record(run_id=run.id, kind="step_failed", visit=position.visit,
                             step=step.name, error=str(exc), retryable=False)
                return self._end(position, Run.Status.FAILED, error=str(exc))
            except NeedsPerson as exc:
                return self._park_for_person(position, exc.kind, exc.request)
            except BudgetExceeded as exc:
                event_record(run_id=run.id, kind="budget_exceeded", visit=position.visit,
                             step=step.name, reason=str(exc))
                if agent.on_budget == "approve":
                    return self._park_for_person(position, "budget", {
                        "title": "Budget reached: raise it?", "reason": str(exc)})
                return self._end(position, Run.Status.FAILED, error=f"budget exceeded: {exc}")
            finally:
                run.active_seconds += time.monotonic() - started
            run.steps_taken += 1
            match transition:
                case Finish(result=result):
                    return self._end(position, Run.Status.SUCCEEDED, result=result)
                case Fail(reason=reason):
                    return self._end(position, Run.Status.FAILED, error=reason)
                case Goto():
                    self.writer.write(position)
                case FanOut(items=items) if not items:  # nothing to fan out: on to the join
                    self.writer.write(position)
                case FanOut():
                    return self._park_fan_out(position, transition)
                case WaitForApproval() | WaitForEvent() | Sleep() | RunChild():
                    return self._park(position, transition)
            if time.monotonic() - slice_started >= self.slice_seconds:
                with transaction.atomic():
                    self.writer.commit_final(position, status=Run.Status.QUEUED, lease_owner="",
                                             lease_expires_at=None)
                    ready_requeue(run_id=run.id)  # back of its tenant's line: fairness
                    self._leave()
                return Outcome.SLICE_USED

    last_error = ""  # the last failed attempt's error, when retries ran out

    def branch_step(self, branch: Branch, step: Step, position: Position) -> Transition | None:
        """Run a fan-out branch's step at the join's position, with the branch's item: its
        logs are read-only and nothing is checkpointed (a branch's result is its row)."""
        self.item, self.branch = branch.item, branch
        self.position = position
        logs = {name: LogView(self.run.id, name, lambda name=name: position.offsets.get(name, 0),
                              lambda name: []) for name in self.agent.logs}
        try:
            return self.step_run(step, position, logs)
        finally:
            self.writer.close()

    def step_run(self, step: Step, position: Position, logs) -> Transition | None:
        policy = step.retry or self.agent.retry
        for attempt in range(1, policy.max_attempts + 1):
            ctx = StepContext(run=self.run, agent=self.agent, visit=position.visit,
                              attempt=attempt, logs=logs, writer=self.writer, item=self.item,
                              branch=self.branch, epoch=self.epoch)
            started, ended = time.perf_counter(), "error"
            try:
                try:
                    with span_start(tracer, f"step {step.name}", attributes={
                            "run.id": str(self.run.id), "step": step.name, "visit": position.visit,
                            "attempt": attempt}) as span:
                        transition = step.fn(ctx, State(position.state, logs))
                        if ctx.interrupt is not None:  # the step caught it and carried on
                            raise ctx.interrupt
                        if not isinstance(transition, Transition):
                            raise StepError(
                                f"step {step.name!r} returned {transition!r}, not a transition")
                        ended = type(transition).__name__
                        span.set_attribute("transition", ended)
                        self.notifications = ctx.notifications
                        ctx.step_completed()
                        return transition
                except INTERRUPTS:
                    ended = "interrupted"
                    raise
                finally:  # how it ended, never which step: a step's name may be a tenant's
                    step_duration.record(time.perf_counter() - started, {"ended": ended})
            except (StepError, *INTERRUPTS):
                raise  # DatabaseError among them: the watchdog retries the run, not the step
            except Exception as exc:  # a step's own failure: retry per policy
                if ctx.interrupt is not None:  # it swallowed an interrupt, then failed anyway
                    raise ctx.interrupt from exc
                if isinstance(exc, EffectRefused):
                    raise StepError(str(exc)) from exc
                self.last_error = error_kept(
                    f"step {step.name!r} raised {type(exc).__name__}: {exc}")
                will_retry = attempt < policy.max_attempts
                event_record(
                    run_id=self.run.id, kind="step_error", visit=position.visit, step=step.name,
                    attempt=attempt, will_retry=will_retry, error=self.last_error,
                    traceback=step_traceback(exc, step.fn),
                )
                if will_retry:
                    self.sleep(policy.backoff(attempt))
        return None

    def _apply(self, step: Step, position: Position, transition: Transition) -> Position:
        refused = transition_refused(step, transition, self.notifications)
        if refused:
            raise StepError(refused)
        undeclared = targets(transition) - step.next
        if undeclared:
            raise StepError(
                f"step {step.name!r} went to {sorted(undeclared)}, which it does not declare "
                f"in next={sorted(step.next)}"
            )
        try:
            state, state_json = state_merge_dumped(position.state, transition.update)
        except StateTooLarge as exc:
            raise StepError(str(exc)) from None
        offsets = dict(position.offsets)
        entries = []
        for name, values in transition.append.items():
            if name not in self.agent.logs:
                raise StepError(f"step {step.name!r} appended to undeclared log {name!r}")
            for value in values:
                entries.append({"log": name, "index": offsets.get(name, 0),
                                "visit": position.visit + 1, "value": value})
                offsets[name] = offsets.get(name, 0) + 1
        match transition:
            case Goto(step=next_step):
                pass
            case FanOut(then=next_step) | WaitForApproval(then=next_step) | \
                    WaitForEvent(then=next_step) | Sleep(then=next_step) | RunChild(then=next_step):
                pass
            case _:
                next_step = None
        outbox = [dict(n, key=idempotency_key(schema=connection.schema_name, run_id=self.run.id,
                                               scope=f"outbox/{position.visit}", name=n["name"]))
                  for n in self.notifications]
        return Position(visit=position.visit + 1, step=next_step, state=state, offsets=offsets,
                        pending_entries=entries, pending_outbox=outbox, state_json=state_json)

    def _cancel_requested(self) -> bool:
        """Seen on every checkpoint write; exit mode, which writes none, asks now and then."""
        if self.writer.cancel_requested:
            return True
        if self.run.durability == Run.Durability.EXIT and time.monotonic() > self._next_cancel_poll:
            self._next_cancel_poll = time.monotonic() + CANCEL_POLL_SECONDS
            return Run.objects.filter(id=self.run.id, cancel_requested=True).exists()
        return False

    _next_cancel_poll = 0.0

    def _end(self, position: Position, status: str, *, event: str | None = None,
             error: str = "", result: Any = None) -> Outcome:
        run = self.run
        kind = event or {"succeeded": "run_succeeded", "failed": "run_failed"}.get(status, status)
        error = json_storable(error_kept(error))  # a text column refuses U+0000 too
        with transaction.atomic():
            self.writer.commit_final(
                position, status=status, result=result, error=error, lease_owner="",
                lease_expires_at=None, finished_at=timezone.now(),
                event=event_row(run_id=run.id, kind=kind, visit=position.visit, error=error,
                                result=result, steps_taken=run.steps_taken),
            )
            run_finished_count(status=status)
            ready_clear(run_id=run.id)
            if run.parent_id:  # a child run reports to the parent waiting on it
                ports().parking["child_report"](run_id=run.id, status=status, result=result, error=error)
            self._leave()
        return Outcome.ENDED

    def _leave(self) -> None:
        """Last in the transaction in which the run leaves this worker (ends, parks, or goes
        back in line): the caller's `on_leave`, if any. A worker's hands its freed slot out in
        that transaction, so that freeing it costs no transaction of its own."""
        if self.on_leave is not None:
            self.on_leave()

    def _park_for_person(self, position: Position, kind: str, request: dict) -> Outcome:
        """Park before the step that needs a person; on the decision it runs again at the same
        visit, so its recorded effects replay and only the undecided one is settled."""
        run = self.run
        # Its checkpoint predates the step (append-only): the approval row is the record, and
        # a fork here runs the step again, its effects under new keys and its budget as started.
        with transaction.atomic():
            self.writer.commit_final(position, status=Run.Status.WAITING, lease_owner="",
                                     lease_expires_at=None, waiting_reason=request["title"])
            if self.writer.cancel_requested:  # asked while parking: cancel wins, nothing opens
                return self._end(position, Run.Status.CANCELLED, event="run_cancelled")
            ready_clear(run_id=run.id)
            event_record(run_id=run.id, kind="run_parked", visit=position.visit,
                         reason=request["title"])
            ports().parking["approval"](run=run, visit=position.visit, request=request,
                                        then=position.step, on_timeout=None, timeout=None,
                                        kind=kind)
            self._leave()
        return Outcome.PARKED

    def _park(self, position: Position, transition: Transition) -> Outcome:
        """Leave the worker: the run becomes rows (a checkpoint, and what it waits on)."""
        parking = ports().parking
        run, visit = self.run, position.visit
        reason, due = park_reason(transition)
        with transaction.atomic():
            position.waiting = dict(waiting_of(transition, due=due), reason=reason)
            self.writer.commit_final(position, status=Run.Status.WAITING, lease_owner="",
                                     lease_expires_at=None, waiting_reason=reason)
            if self.writer.cancel_requested:  # asked while parking: cancel wins, nothing opens
                return self._end(position, Run.Status.CANCELLED, event="run_cancelled")
            ready_clear(run_id=run.id)
            event_record(run_id=run.id, kind="run_parked", visit=visit, reason=reason)
            match transition:
                case WaitForApproval(request=request, then=then, on_timeout=on_timeout,
                                     timeout=timeout):
                    parking["approval"](run=run, visit=visit, request=request, then=then,
                                        on_timeout=on_timeout, timeout=timeout)
                case WaitForEvent(kind=kind, key=key, then=then, on_timeout=on_timeout,
                                  timeout=timeout, since=since):
                    parking["event_gate"](run=run, visit=visit, kind=kind, key=key, then=then,
                                          on_timeout=on_timeout, timeout=timeout,
                                          since=since or datetime.fromtimestamp(
                                              self.step_started, UTC))
                case Sleep():
                    parking["timer"](run_id=run.id, visit=visit, due_at=due)
                case RunChild(agent=agent, input=input, then=then, version=version):
                    try:
                        child = parking["child_run"](agent=agent, version=version, input=input,
                                                     parent_id=run.id,
                                                     durability=run.durability).run
                    except ServiceError as exc:  # rolls the parking back: nothing is left
                        raise ChildRunRefused(f"the child run of {agent!r} was refused: "
                                              f"{exc.message}") from None
                    parking["event_gate"](run=run, visit=visit, kind="child_run",
                                          key=str(child.id), then=then, on_timeout=None,
                                          timeout=None)
            self._leave()
        return Outcome.PARKED

    def _park_fan_out(self, position: Position, fan_out: FanOut) -> Outcome:
        """Park the run at the join step and put one branch per item in line."""
        run = self.run
        reason, _ = park_reason(fan_out)
        position.waiting = dict(waiting_of(fan_out), reason=reason)
        with transaction.atomic():
            self.writer.commit_final(position, status=Run.Status.WAITING, lease_owner="",
                                     lease_expires_at=None, waiting_reason=reason)
            if self.writer.cancel_requested:  # asked while parking: cancel wins, no branches
                return self._end(position, Run.Status.CANCELLED, event="run_cancelled")
            Branch.objects.bulk_create(
                Branch(run_id=run.id, visit=position.visit, index=i, step=fan_out.step, item=item)
                for i, item in enumerate(fan_out.items)
            )
            ready_clear(run_id=run.id)
            for i in range(len(fan_out.items)):
                ready_mark(run_id=run.id, branch=i)
            event_record(run_id=run.id, kind="fan_out", visit=position.visit,
                         step=fan_out.step, branches=len(fan_out.items), join=fan_out.then)
            self._leave()
        return Outcome.PARKED


# The texts a transition or a ctx.notify names that are stored in columns of a bounded length.
_BOUNDED = {"event kind": EventGate._meta.get_field("kind"),
            "event key": EventGate._meta.get_field("key"),
            "notify name": OutboxMessage._meta.get_field("name"),
            "notify connector": OutboxMessage._meta.get_field("connector")}


WAIT_MAX = timedelta(days=3650)  # a timeout, a sleep: what a wakeup row and its sum can hold
FAN_OUT_MAX_ITEMS = 10_000  # branches of one fan-out: each a row, a ready row, a task
ERROR_MAX_CHARS = 8192  # of a fail() reason or a step's exception, as the run records it


def transition_refused(step: Step, transition: Transition, notifications: list[dict]) -> str:
    """Why the engine refuses what a step returned, in words ("" if it takes it): a field of
    the wrong type, a value PostgreSQL cannot store or a text longer than its column, or more
    than RUN_TRANSITION_MAX_BYTES besides the state. The same for a run's step and a fan-out
    branch's; the state's own limits are `state_merge_dumped`'s."""
    misshapen = shape_wrong(transition)
    if misshapen:
        return f"step {step.name!r} returned {misshapen}"
    try:
        carried = len(json_dumped(stored(transition)))
        if notifications:
            carried += len(json_dumped(notifications, default=str))
        texts_fit(transition, notifications)
    except Unstorable as exc:
        return f"step {step.name!r} returned a value that cannot be stored: {exc}"
    if carried > settings.RUN_TRANSITION_MAX_BYTES:
        return (f"step {step.name!r} returned {carried} bytes of JSON besides its state (appended "
                f"values, a result, a request, items, an input, notifications), over the "
                f"{settings.RUN_TRANSITION_MAX_BYTES}-byte limit: keep files in the run's "
                "workspace and pass their names")
    return ""


def _aware_within(moment, before: timedelta, after: timedelta) -> bool:
    """A timezone-aware datetime between now - `before` and now + `after`."""
    if not isinstance(moment, datetime) or not timezone.is_aware(moment):
        return False
    now = timezone.now()
    return now - before <= moment <= now + after


def _names(transition: Transition) -> list:
    """The step and agent names a transition carries (sets are made of them: text only)."""
    match transition:
        case Goto(step=step):
            return [step]
        case WaitForApproval(then=then, on_timeout=other) | WaitForEvent(then=then,
                                                                         on_timeout=other):
            return [then] if other is None else [then, other]
        case Sleep(then=then):
            return [then]
        case RunChild(then=then, agent=agent):
            return [then, agent]
        case FanOut(step=step, then=then):
            return [step, then]
    return []


def shape_wrong(transition: Transition) -> str:
    """What is wrong with the types of a transition's fields (its helpers do not check them:
    a step may build one from a model's output), in words; "" if nothing. Refused at the step
    boundary, the run failing, instead of an engine error where it is recorded."""
    if not all(isinstance(name, str) for name in _names(transition)):
        return f"{type(transition).__name__} with a step or agent name that is not text"
    if type(transition) is Goto:  # most steps: nothing else typed to check
        return ""
    match transition:
        case Fail(reason=reason) if not isinstance(reason, str):
            return f"fail() with a {type(reason).__name__} as its reason: it takes text"
        case WaitForApproval(request=request) if not isinstance(request, dict):
            return f"wait_for_approval() with a {type(request).__name__}: it takes a dict"
        case WaitForApproval(request=request) if not (
                isinstance(deciders := request.get("deciders", []), list)
                and all(isinstance(decider, str) for decider in deciders)):
            return "wait_for_approval() whose deciders are not a list of texts"
        case RunChild(input=payload) if not isinstance(payload, dict):
            return f"run_child() with a {type(payload).__name__} as its input: it takes a dict"
        case RunChild(version=version) if version is not None and type(version) is not int:
            return "run_child() whose version is not a whole number"
        case FanOut(items=items) if not isinstance(items, list):
            return "fan_out() whose items are not a list"
        case FanOut(items=items) if len(items) > FAN_OUT_MAX_ITEMS:
            return f"fan_out() of {len(items)} items, over the {FAN_OUT_MAX_ITEMS}-item limit"
        case Sleep(until=until, duration=duration) if (until is None) == (duration is None):
            return "sleep() with both or neither of until= and duration="
        case Sleep(until=until) if until is not None and not _aware_within(until, WAIT_MAX,
                                                                             WAIT_MAX):
            return (f"sleep(until=...) that is not a timezone-aware datetime within "
                    f"{WAIT_MAX.days} days of now")
        case WaitForEvent(since=since) if since is not None and not _aware_within(
                since, WAIT_MAX, timedelta(0)):
            return (f"wait_for_event(since=...) that is not a timezone-aware datetime within the "
                    f"last {WAIT_MAX.days} days")
    for name in ("timeout", "duration"):
        span = getattr(transition, name, None)
        if span is not None and not (isinstance(span, timedelta)
                                     and timedelta(0) <= span <= WAIT_MAX):
            return f"a {name} that is not a timedelta of 0 to {WAIT_MAX.days} days"
    return ""


def error_kept(text: str) -> str:
    """An error text as a run records it: at most ERROR_MAX_CHARS, redacted. Cut with a margin
    first (redacting is slow on long text), redacted, then cut to size: a secret that straddled
    the first cut is past the second."""
    if len(text) <= ERROR_MAX_CHARS:
        return secrets_redact(text)
    return secrets_redact(text[:ERROR_MAX_CHARS + 1024])[:ERROR_MAX_CHARS] + \
        f"... ({len(text) - ERROR_MAX_CHARS} more characters not kept)"


def texts_fit(transition: Transition, notifications: list[dict]) -> None:
    """Unstorable unless each bounded text is a string within its column's length."""
    texts = [("notify name", n["name"]) for n in notifications] + \
        [("notify connector", n["connector"]) for n in notifications]
    if isinstance(transition, WaitForEvent):
        texts += [("event kind", transition.kind), ("event key", transition.key)]
    for what, text in texts:
        limit = _BOUNDED[what].max_length
        if not isinstance(text, str) or len(text) > limit:
            raise Unstorable(f"the {what} must be text of at most {limit} characters")


def step_traceback(exc: BaseException, fn) -> str:
    """The traceback a tenant reads in a `step_error` event: the frames from the step function
    down, never the engine's and the platform's above it (their paths and code are the
    operator's); redacted. An error raised outside the step's body (after it returned) shows
    the exception alone."""
    code = getattr(inspect.unwrap(fn), "__code__", None)
    tb: TracebackType | None = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code is not code:
        tb = tb.tb_next
    if tb is None:
        text = "".join(traceback.format_exception_only(type(exc), exc))
    else:
        text = "".join(traceback.format_exception(type(exc), exc, tb, limit=TRACEBACK_MAX_FRAMES,
                                                  chain=False))
    return secrets_redact(text[-(TRACEBACK_MAX_CHARS + 1024):])[-TRACEBACK_MAX_CHARS:]
