"""The harness: claims a run, loads its checkpoint, runs steps, writes checkpoints.

No HTTP and no Celery in here: the worker task, the tests and the benchmarks all call
`advance()`. It runs in the tenant schema the caller selected.

A run is claimed with a lease (owner, epoch, expiry) in one atomic UPDATE; every write made
under the lease is fenced on the epoch, so a worker that lost its lease stops at its next write
instead of overwriting its successor's work.
"""

import json
import logging
import os
import socket
import time
import traceback
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from enum import StrEnum
from typing import Any
from uuid import UUID

import psycopg
from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.db.models import F
from django.utils import timezone
from opentelemetry import trace

from dispatch.services import ready_clear, ready_defer, ready_mark, ready_requeue
from effects.models import OutboxMessage
from effects.services import (
    BudgetExceeded,
    EffectRefused,
    NeedsPerson,
    idempotency_key,
    outbox_kick,
)

from .agents import Agent, Step, UnknownAgent, registry
from .leases import leases
from .models import Branch, Checkpoint, LogEntry, Run, RunEvent
from .state import LogView, State, StateTooLarge, state_merge
from .transitions import (
    Fail,
    FanOut,
    Finish,
    Goto,
    RunChild,
    Sleep,
    Transition,
    WaitForApproval,
    WaitForEvent,
    targets,
)

log = logging.getLogger(__name__)
tracer = trace.get_tracer("agentplatform.runs")


CANCEL_POLL_SECONDS = 0.5


class Outcome(StrEnum):
    NOT_CLAIMED = "not_claimed"  # someone else holds the lease, or nothing to do
    SLICE_USED = "slice_used"  # still runnable: enqueue again
    PARKED = "parked"
    ENDED = "ended"
    LEASE_LOST = "lease_lost"
    DEFERRED = "deferred"  # this worker lacks the run's agent version: back in line, later


class LeaseLost(Exception):
    """The run's lease epoch moved on: another worker owns the run now."""


class CheckpointWriteFailed(Exception):
    """A checkpoint could not be written (async/exit modes): the run must stop here and be
    resumed from its last durable checkpoint, never continue past the gap."""


class StepError(Exception):
    """A step broke the rules of the engine; retrying cannot help."""


# Raised to the harness through a step: a step's own `except Exception` cannot swallow them,
# because the context remembers the one it raised and the harness raises it again.
INTERRUPTS = (LeaseLost, NeedsPerson, BudgetExceeded, CheckpointWriteFailed, DatabaseError)


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass
class Position:
    """Where the run is: the checkpoint the engine will write next, kept in memory."""

    visit: int
    step: str | None
    state: dict[str, Any]
    offsets: dict[str, int]
    pending_entries: list[LogEntry] = field(default_factory=list)
    pending_outbox: list[dict] = field(default_factory=list)  # ctx.notify(...) of the step
    waiting: dict | None = None  # what the run parks on at this checkpoint (Checkpoint.waiting)
    handed_over: bool = False  # given to the writer (committed, in flight, or held)


def run_claim(*, run_id: UUID, owner: str, lease_seconds: float | None = None) -> int | None:
    """Take the run's lease if it is runnable and nobody holds a live lease. Returns the epoch.

    Counts the claim: a run claimed again and again without a new checkpoint (its step kills
    the worker) is parked for a person by `advance` instead of being claimed forever."""
    ttl = timedelta(seconds=lease_seconds or settings.RUN_LEASE_SECONDS)
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            UPDATE {Run._meta.db_table}
               SET status = 'running', lease_owner = %s, lease_epoch = lease_epoch + 1,
                   lease_expires_at = now() + %s, started_at = coalesce(started_at, now()),
                   claims_without_checkpoint = claims_without_checkpoint + 1,
                   updated_at = now()
             WHERE id = %s AND status IN ('queued', 'running')
               AND (lease_expires_at IS NULL OR lease_expires_at < now())
         RETURNING lease_epoch
            """,
            [owner, ttl, run_id],
        )
        row = cursor.fetchone()
    return row[0] if row else None


def run_release_unknown(*, run: Run, epoch: int, reason: str) -> Outcome:
    """This worker does not have the run's agent version (a rolling deploy): give the claim back
    uncounted and put the run in line again after a delay, for a worker that has it. After
    RUN_UNKNOWN_AGENT_GRACE_SECONDS of that, park it for a person."""
    with transaction.atomic():
        deferred_for = ready_defer(run_id=run.id,
                                   delay_seconds=settings.RUN_UNKNOWN_AGENT_RETRY_SECONDS)
        if deferred_for <= settings.RUN_UNKNOWN_AGENT_GRACE_SECONDS:
            with connection.cursor() as cursor:
                cursor.execute(
                    f"UPDATE {Run._meta.db_table} SET status = 'queued', lease_owner = '', "
                    "lease_expires_at = NULL, updated_at = now(), "
                    "claims_without_checkpoint = greatest(claims_without_checkpoint - 1, 0) "
                    "WHERE id = %s AND lease_epoch = %s",
                    [run.id, epoch],
                )
                if cursor.rowcount == 0:
                    raise LeaseLost(f"run {run.id}: lease epoch {epoch} was taken over")
            event_record(run_id=run.id, kind="agent_unknown_here", reason=reason,
                         owner=worker_id(), deferred_seconds=round(deferred_for, 1))
            return Outcome.DEFERRED
    return run_park_refused(run=run, epoch=epoch, reason=(  # clears the deferred ready row
        f"{reason} (no worker ran it within {settings.RUN_UNKNOWN_AGENT_GRACE_SECONDS:g}s)"))


class CheckpointWriter:
    """Writes checkpoints per the run's durability mode.

    sync: committed before the next step starts. async: committed on a second connection
    while the next steps run, at most RUN_ASYNC_MAX_PENDING_WRITES in flight (then the step
    loop waits); `flush()` waits for all (before effects and before parking).
    exit: kept in memory and written once, when the run leaves this worker.
    """

    def __init__(self, run: Run, epoch: int):
        self.run, self.epoch = run, epoch
        self.mode = run.durability
        self._held: Position | None = None
        self.cancel_requested = False
        self._failed: Exception | None = None  # sticky: after a failed write, nothing more
        self._future: Future | None = None
        self._in_flight: deque[Future] = deque()  # async writes not yet known to be committed
        self._executor: ThreadPoolExecutor | None = None
        if self.mode == Run.Durability.ASYNC:
            schema = connection.schema_name
            self._executor = ThreadPoolExecutor(
                max_workers=1, initializer=lambda: connection.set_schema(schema)
            )

    def write(self, position: Position) -> None:
        position.handed_over = True
        if self.mode == Run.Durability.SYNC:
            self._commit(position)
        elif self.mode == Run.Durability.ASYNC:
            while len(self._in_flight) >= settings.RUN_ASYNC_MAX_PENDING_WRITES:
                self._settle(self._in_flight.popleft())  # bounded: memory and loss on a crash
            previous = self._future
            self._future = self._executor.submit(self._commit_after, previous, position)
            self._in_flight.append(self._future)
        else:
            if self._held is not None:
                position.pending_entries[:0] = self._held.pending_entries
                position.pending_outbox[:0] = self._held.pending_outbox
            self._held = position

    def flush(self) -> None:
        """Make everything handed over so far durable."""
        self._wait()
        if self._held is not None:
            try:
                self._commit(self._held)
            except LeaseLost:
                raise
            except Exception as exc:
                self._failed = exc
                raise CheckpointWriteFailed(f"checkpoint write failed: {exc}") from exc
            self._held = None

    def unwritten_values(self, log_name: str) -> list[Any]:
        """Values of log entries handed over but not yet in the database, in order."""
        self._wait()
        held = self._held.pending_entries if self._held is not None else []
        return [entry.value for entry in held if entry.log == log_name]

    def commit_final(self, position: Position, **run_fields) -> None:
        """Write the checkpoint the run leaves this worker with, together with its run fields."""
        self._wait()
        if self._held is not None and self._held is not position:
            position.pending_entries[:0] = self._held.pending_entries
            position.pending_outbox[:0] = self._held.pending_outbox
        if position.handed_over and self._held is None:  # already committed: fields only
            self.cancel_requested |= run_fence(run=self.run, epoch=self.epoch,
                                               visit=position.visit, **run_fields)
        else:
            self._commit(position, **run_fields)
            position.handed_over = True  # a second commit_final (cancel at park) is fields only
        self._held = None

    def close(self) -> None:
        if self._executor is not None:
            try:
                self._executor.submit(lambda: connection.close()).result()
            finally:
                self._executor.shutdown(wait=True)

    def _wait(self) -> None:
        if self._failed is not None:
            raise CheckpointWriteFailed(f"an earlier checkpoint write failed: {self._failed}")
        if self._future is not None:
            self._settle(self._future)
            self._future = None
            self._in_flight.clear()

    def _settle(self, future: Future) -> None:
        try:
            future.result()
        except LeaseLost:
            raise
        except Exception as exc:  # later positions build on this one: stop here
            self._failed = exc
            raise CheckpointWriteFailed(f"checkpoint write failed: {exc}") from exc

    def _commit_after(self, previous: Future | None, position: Position) -> None:
        if previous is not None:
            previous.result()
        self._commit(position)

    def _commit(self, position: Position, **run_fields) -> None:
        self.cancel_requested |= checkpoint_commit(
            run=self.run, epoch=self.epoch, position=position, **run_fields
        )
        position.pending_entries, position.pending_outbox = [], []


def _run_assignments(run: Run, fields: dict[str, Any]) -> tuple[str, list[Any]]:
    """SET clause for the run row: counters, lease extension (unless released), `fields`."""
    values = {"steps_taken": run.steps_taken, "active_seconds": run.active_seconds, **fields}
    sql = ["updated_at = now()", "claims_without_checkpoint = 0"]  # progress: not a poison step
    params: list[Any] = []
    if "lease_owner" not in fields:
        sql.append("lease_expires_at = now() + %s")
        params.append(timedelta(seconds=settings.RUN_LEASE_SECONDS))
    for name, value in values.items():
        column = Run._meta.get_field(name)
        sql.append(f"{column.column} = %s")
        params.append(column.get_db_prep_save(value, connection))
    return ", ".join(sql), params


def _prepared(sql: str, params: list[Any]) -> tuple | None:
    """Execute on the raw connection as a server-side prepared statement: the hot path is
    planned once per connection, and no `SET search_path` round trip precedes it (tables are
    schema-qualified). Joins the surrounding transaction, if any."""
    connection.ensure_connection()
    with connection.wrap_database_errors, psycopg.Cursor(connection.connection) as cursor:
        cursor.execute(sql, params, prepare=True)  # psycopg errors become Django's
        return cursor.fetchone()


def checkpoint_commit(*, run: Run, epoch: int, position: Position, **run_fields) -> bool:
    """Write a checkpoint, its new log entries and the run's counters in one statement, fenced
    on the lease epoch: if the epoch moved on, nothing is written and LeaseLost is raised.
    Returns whether a cancel was requested."""
    assignments, params = _run_assignments(run, run_fields)
    entries, outbox = position.pending_entries, position.pending_outbox
    schema = connection.schema_name
    sql = f"""
        WITH fence AS (
            UPDATE "{schema}".{Run._meta.db_table} SET {assignments}
             WHERE id = %s AND lease_epoch = %s
         RETURNING id, cancel_requested
        ), checkpoint AS (
            INSERT INTO "{schema}".{Checkpoint._meta.db_table}
                   (run_id, visit, step, state, log_offsets, agent_version, topology_hash,
                    waiting, created_at)
            SELECT id, %s, %s, %s::jsonb, %s::jsonb, %s, %s, %s::jsonb, now() FROM fence
        ), entries AS (
            INSERT INTO "{schema}".{LogEntry._meta.db_table} (run_id, log, index, visit, value)
            SELECT fence.id, e.log, e.index, e.visit, e.value::jsonb
              FROM fence, unnest(%s::text[], %s::int[], %s::int[], %s::text[])
                   AS e(log, index, visit, value)
        ), outbox AS (
            INSERT INTO "{schema}".{OutboxMessage._meta.db_table}
                   (run_id, name, connector, args, idempotency_key, status, attempts,
                    next_attempt_at, last_error, created_at)
            SELECT fence.id, o.name, o.connector, o.args::jsonb, o.key, 'pending', 0, now(), '',
                   now()
              FROM fence, unnest(%s::text[], %s::text[], %s::text[], %s::text[])
                   AS o(name, connector, args, key)
            ON CONFLICT (idempotency_key) DO NOTHING
        )
        SELECT cancel_requested FROM fence
    """
    params += [
        run.id, epoch,
        position.visit, position.step, json.dumps(position.state),
        json.dumps(position.offsets), run.agent_version, run.topology_hash,
        None if position.waiting is None else json.dumps(position.waiting, default=str),
        [e.log for e in entries], [e.index for e in entries], [e.visit for e in entries],
        [json.dumps(e.value) for e in entries],
        *([n[field] for n in outbox] for field in ("name", "connector")),
        [json.dumps(n["args"], default=str) for n in outbox], [n["key"] for n in outbox],
    ]
    row = _prepared(sql, params)
    if outbox and not connection.in_atomic_block:
        outbox_kick()  # committed: ring the dispatcher (an atomic caller rings on commit)
    elif outbox:
        transaction.on_commit(outbox_kick)
    if row is None:
        raise LeaseLost(f"run {run.id}: lease epoch {epoch} was taken over "
                        f"(checkpoint {position.visit} not written)")
    return row[0]


def run_fence(*, run: Run, epoch: int, visit: int | None = None, **fields) -> bool:
    """Update the run's counters and `fields` only if our lease epoch still holds."""
    assignments, params = _run_assignments(run, fields)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {Run._meta.db_table} SET {assignments} WHERE id = %s AND lease_epoch = %s "
            "RETURNING cancel_requested",
            params + [run.id, epoch],
        )
        row = cursor.fetchone()
    if row is None:
        raise LeaseLost(f"run {run.id}: lease epoch {epoch} was taken over (at visit {visit})")
    return row[0]


def event_record(*, run_id: UUID, kind: str, visit: int | None = None, **data) -> None:
    RunEvent.objects.create(run_id=run_id, kind=kind, visit=visit, data=data)


class StepContext:
    """What a step sees besides its state: the run, its input, its logs, the visit."""

    def __init__(self, *, run: Run, agent: Agent, visit: int, attempt: int,
                 logs: dict[str, LogView], writer: CheckpointWriter, item: Any = None,
                 branch: Branch | None = None, epoch: int = -1):
        self.item = item  # in a fan-out branch: its item, and its index in `branch`
        self.branch = None if branch is None else branch.index
        self.scope = f"{visit}" if branch is None else f"{visit}/b{branch.index}"
        # Effects are fenced on the lease that runs this step: the run's, or the branch's own.
        self._fence = (epoch, None) if branch is None else (branch.lease_epoch, branch.id)
        self.interrupt: BaseException | None = None  # what a ctx call raised to stop the step
        self._models = 0
        self.notifications: list[dict] = []
        self.run_id = run.id
        self.input = run.input
        self.agent = agent
        self.visit = visit
        self.attempt = attempt
        self._logs = logs
        self._writer = writer
        self._sandbox = None

    @property
    def sandbox(self):
        """The run's jailed workspace (sandboxes/), opened on first use in this step."""
        if self._sandbox is None:
            from sandboxes.services import SandboxSession

            self._sandbox = SandboxSession(run_id=self.run_id, visit=self.visit,
                                           scope=self.scope)
        return self._sandbox

    def step_completed(self) -> None:
        """The step returned a transition: make its sandbox work durable (workspace snapshot)."""
        if self._sandbox is not None:
            self._sandbox.step_completed()

    def log(self, name: str) -> LogView:
        return self._logs[name]

    def effect(self, name: str, connector: str, **args) -> Any:
        """Do something externally visible exactly once per (run, step visit, name): a re-run
        of this step gets the recorded result instead of acting again."""
        from effects.services import effect_perform

        with self._interrupting():
            self.barrier()  # the state this effect depends on is durable before it happens
            return effect_perform(scope=self._effect_scope(), name=name, connector=connector,
                                  args=args)

    def model(self, messages: list[dict], *, model: str | None = None, name: str | None = None,
              max_tokens: int = 1024, **options) -> dict:
        """A chat-completion call through the `model` connector: an effect, so a recorded
        call is never made (or paid for) twice; refused before sending if over budget."""
        from effects.services import budget_checker, effect_perform

        self._models += 1
        args = {"messages": messages, "max_tokens": max_tokens, **options}
        if model:
            args["model"] = model
        with self._interrupting():
            self.barrier()
            return effect_perform(
                scope=self._effect_scope(), name=name or f"model-{self._models}",
                connector="model", args=args,
                budget_check=budget_checker(run_id=self.run_id, requested_tokens=max_tokens))

    def _effect_scope(self):
        from effects.services import Scope

        epoch, branch_id = self._fence
        return Scope(self.run_id, self.scope, epoch, branch=branch_id)

    @contextmanager
    def _interrupting(self):
        """Remember an interrupt on its way out: the harness raises it again after the step,
        whatever the step's own `except Exception:` did with it."""
        try:
            yield
        except INTERRUPTS as exc:
            self.interrupt = self.interrupt or exc
            raise

    def notify(self, name: str, connector: str, **args) -> None:
        """Fire and forget: committed with this step's checkpoint, delivered at least once
        afterwards, once at the receiver (its key is stable)."""
        self.notifications.append({"name": name, "connector": connector, "args": args})

    def barrier(self) -> None:
        """Make every checkpoint so far durable; called before anything externally visible."""
        with self._interrupting():
            self._writer.flush()

    @property
    def fan_out(self) -> list["BranchResult"]:
        """In a join step: every branch's outcome, in item order."""
        return [
            BranchResult(b.index, b.item, b.status == Branch.Status.DONE, b.result, b.error)
            for b in Branch.objects.filter(run_id=self.run_id, visit=self.visit).order_by("index")
        ]


@dataclass(frozen=True)
class BranchResult:
    index: int
    item: Any
    ok: bool
    value: Any
    error: str


class Harness:
    """Runs one claimed run's steps until it parks, ends, or its time slice is used."""

    def __init__(self, run: Run, agent: Agent, epoch: int, owner: str, slice_seconds: float,
                 sleep=time.sleep):
        self.run, self.agent, self.epoch, self.owner = run, agent, epoch, owner
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
        position = self.position = position_load(run=run)
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
            started, self.step_started_at = time.monotonic(), timezone.now()
            try:
                transition = self._step_run(step, position, logs)
                if transition is None:  # retries exhausted; the errors are in the events
                    return self._end(position, Run.Status.FAILED, error=self._last_error)
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
                return Outcome.SLICE_USED

    _last_error = ""

    def _step_run(self, step: Step, position: Position, logs) -> Transition | None:
        policy = step.retry or self.agent.retry
        for attempt in range(1, policy.max_attempts + 1):
            ctx = StepContext(run=self.run, agent=self.agent, visit=position.visit,
                              attempt=attempt, logs=logs, writer=self.writer, item=self.item,
                              branch=self.branch, epoch=self.epoch)
            try:
                with tracer.start_as_current_span(f"step {step.name}", attributes={
                        "run.id": str(self.run.id), "step": step.name, "visit": position.visit,
                        "attempt": attempt}) as span:
                    transition = step.fn(ctx, State(position.state, logs))
                    if ctx.interrupt is not None:  # the step caught it and carried on
                        raise ctx.interrupt
                    if not isinstance(transition, Transition):
                        raise StepError(
                            f"step {step.name!r} returned {transition!r}, not a transition")
                    span.set_attribute("transition", type(transition).__name__)
                    self.notifications = ctx.notifications
                    ctx.step_completed()
                    return transition
            except (StepError, *INTERRUPTS):
                raise  # DatabaseError among them: the watchdog retries the run, not the step
            except Exception as exc:  # a step's own failure: retry per policy
                if ctx.interrupt is not None:  # it swallowed an interrupt, then failed anyway
                    raise ctx.interrupt from exc
                if isinstance(exc, EffectRefused):
                    raise StepError(str(exc)) from exc
                self._last_error = f"step {step.name!r} raised {type(exc).__name__}: {exc}"
                will_retry = attempt < policy.max_attempts
                event_record(
                    run_id=self.run.id, kind="step_error", visit=position.visit, step=step.name,
                    attempt=attempt, will_retry=will_retry, error=self._last_error,
                    traceback=traceback.format_exc(limit=20)[-4000:],
                )
                if will_retry:
                    self.sleep(policy.backoff(attempt))
        return None

    def _apply(self, step: Step, position: Position, transition: Transition) -> Position:
        undeclared = targets(transition) - step.next
        if undeclared:
            raise StepError(
                f"step {step.name!r} went to {sorted(undeclared)}, which it does not declare "
                f"in next={sorted(step.next)}"
            )
        try:
            state = state_merge(position.state, transition.update)
        except StateTooLarge as exc:
            raise StepError(str(exc)) from None
        offsets = dict(position.offsets)
        entries = []
        for name, values in transition.append.items():
            if name not in self.agent.logs:
                raise StepError(f"step {step.name!r} appended to undeclared log {name!r}")
            for value in values:
                entries.append(LogEntry(run_id=self.run.id, log=name, index=offsets.get(name, 0),
                                        visit=position.visit + 1, value=value))
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
                        pending_entries=entries, pending_outbox=outbox)

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
        with transaction.atomic():
            self.writer.commit_final(
                position, status=status, result=result, error=error, lease_owner="",
                lease_expires_at=None, finished_at=timezone.now(),
            )
            event_record(run_id=run.id, kind=kind, visit=position.visit, error=error,
                         result=result, steps_taken=run.steps_taken)
            ready_clear(run_id=run.id)
            if run.parent_id:  # a child run reports to the parent waiting on it
                from runs.services import child_report

                child_report(run_id=run.id, status=status, result=result, error=error)
        return Outcome.ENDED

    def _park_for_person(self, position: Position, kind: str, request: dict) -> Outcome:
        """Park before the step that needs a person; on the decision it runs again at the same
        visit, so its recorded effects replay and only the undecided one is settled."""
        from approvals.services import approval_open

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
            approval_open(run=run, visit=position.visit, request=request, then=position.step,
                          on_timeout=None, timeout=None, kind=kind)
        return Outcome.PARKED

    def _park(self, position: Position, transition: Transition) -> Outcome:
        """Leave the worker: the run becomes rows (a checkpoint, and what it waits on)."""
        from approvals import services as parking
        from runs.services import run_start

        run, visit, due = self.run, position.visit, None
        with transaction.atomic():
            match transition:
                case WaitForApproval(request=request):
                    reason = f"approval: {request.get('title', 'requested')}"
                case WaitForEvent(kind=kind, key=key):
                    reason = f"event {kind}:{key}"
                case Sleep(until=until, duration=duration):
                    due = until or timezone.now() + duration
                    reason = f"sleeping until {due.isoformat()}"
                case RunChild(agent=agent):
                    reason = f"child run of {agent}"
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
                    parking.approval_open(run=run, visit=visit, request=request, then=then,
                                          on_timeout=on_timeout, timeout=timeout)
                case WaitForEvent(kind=kind, key=key, then=then, on_timeout=on_timeout,
                                  timeout=timeout, since=since):
                    parking.gate_open(run=run, visit=visit, kind=kind, key=key, then=then,
                                      on_timeout=on_timeout, timeout=timeout,
                                      since=since or self.step_started_at)
                case Sleep():
                    parking.wakeup_schedule(run_id=run.id, visit=visit, due_at=due)
                case RunChild(agent=agent, input=input, then=then, version=version):
                    child = run_start(agent=agent, version=version, input=input,
                                      parent_id=run.id, durability=run.durability).run
                    parking.gate_open(run=run, visit=visit, kind="child_run", key=str(child.id),
                                      then=then, on_timeout=None, timeout=None)
        return Outcome.PARKED

    def _park_fan_out(self, position: Position, fan_out: FanOut) -> Outcome:
        """Park the run at the join step and put one branch per item in line."""
        run = self.run
        reason = f"fan_out: {len(fan_out.items)} branches"
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
        return Outcome.PARKED


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


def position_load(*, run: Run) -> Position:
    """The run's latest checkpoint (run_start writes visit 0)."""
    checkpoint = run.checkpoints.order_by("-visit").first()
    if checkpoint is None:
        raise StepError(f"run {run.id} has no checkpoint to resume from")
    return Position(visit=checkpoint.visit, step=checkpoint.step, state=checkpoint.state,
                    offsets=dict(checkpoint.log_offsets), handed_over=True)


def run_park_refused(*, run: Run, epoch: int, reason: str,
                     kind: str = "resume_refused") -> Outcome:
    """Leave a run parked (waiting) with the reason it cannot run on this code."""
    with transaction.atomic():
        run_fence(run=run, epoch=epoch, status=Run.Status.WAITING, waiting_reason=reason,
                  lease_owner="", lease_expires_at=None)
        event_record(run_id=run.id, kind=kind, reason=reason)
        ready_clear(run_id=run.id)
    log.warning("run %s parked: %s", run.id, reason)
    return Outcome.PARKED


def run_end_cancelled(*, run: Run, epoch: int) -> Outcome:
    """End a claimed run whose cancel was asked for before its steps ran again."""
    with transaction.atomic():
        run_fence(run=run, epoch=epoch, status=Run.Status.CANCELLED, lease_owner="",
                  lease_expires_at=None, finished_at=timezone.now())
        event_record(run_id=run.id, kind="run_cancelled", steps_taken=run.steps_taken)
        ready_clear(run_id=run.id)
        if run.parent_id:
            from runs.services import child_report

            child_report(run_id=run.id, status=Run.Status.CANCELLED, result=None,
                         error="cancelled")
    return Outcome.ENDED


def _poison_reason(*, claims: int, step: str | None, where: str) -> str:
    return (f"poison step: {where} was claimed {claims} times without reaching a checkpoint "
            f"(step {step!r} stops its worker: a crash, OOM or kill); fix the agent, then "
            "re-queue or migrate it")


def advance(*, run_id: UUID, owner: str | None = None, slice_seconds: float | None = None,
            sleep=time.sleep) -> Outcome:
    """Claim the run and run its steps until it parks, ends or uses its slice."""
    owner = owner or worker_id()
    epoch = run_claim(run_id=run_id, owner=owner)
    if epoch is None:
        return Outcome.NOT_CLAIMED
    run = Run.objects.get(id=run_id)
    if run.cancel_requested:  # cancel wins over parking it for a person or handing it back
        return run_end_cancelled(run=run, epoch=epoch)
    if run.claims_without_checkpoint > settings.RUN_MAX_CLAIMS_WITHOUT_CHECKPOINT:
        step = run.checkpoints.order_by("-visit").values_list("step", flat=True).first()
        return run_park_refused(run=run, epoch=epoch, kind="poison_step", reason=_poison_reason(
            claims=run.claims_without_checkpoint - 1, step=step, where="the run"))
    agent, refusal, unknown_here = agent_for(run)
    if unknown_here:
        return run_release_unknown(run=run, epoch=epoch, reason=refusal)
    if refusal:
        return run_park_refused(run=run, epoch=epoch, reason=refusal)
    harness = Harness(run, agent, epoch, owner,
                      slice_seconds if slice_seconds is not None else settings.RUN_SLICE_SECONDS,
                      sleep=sleep)
    lease = {"schema": connection.schema_name, "table": Run._meta.db_table, "row_id": run.id}
    leases.hold(epoch=epoch, **lease)
    try:
        with tracer.start_as_current_span("run.advance", attributes={
                "tenant": connection.schema_name, "run.id": str(run.id), "agent": run.agent,
                "agent.version": run.agent_version, "lease.epoch": epoch,
                "durability": run.durability}) as span:
            outcome = harness.go()
            span.set_attribute("outcome", outcome.value)
            span.set_attribute("run.steps_taken", run.steps_taken)
            return outcome
    except LeaseLost as exc:
        log.warning("stopping: %s", exc)
        return Outcome.LEASE_LOST
    except (DatabaseError, CheckpointWriteFailed):
        raise  # the database is away: the lease expires and the watchdog retries the run
    except Exception as exc:  # a bug in the platform, not in a step: park, never loop
        log.exception("engine error on run %s", run_id)
        event_record(run_id=run.id, kind="engine_error", error=f"{type(exc).__name__}: {exc}",
                     traceback=traceback.format_exc(limit=30)[-6000:])
        return run_park_refused(run=run, epoch=epoch, reason=(
            f"engine error: {type(exc).__name__}: {exc}; fix and re-queue it from the console"))
    finally:
        leases.release(**lease)


def agent_for(run: Run) -> tuple[Agent | None, str, bool]:
    """The registered code the run is pinned to; or why it cannot run on this deploy, and
    whether only this worker lacks it (its version is not deployed here: another may have it)."""
    try:
        agent = registry.get(run.agent, run.agent_version)
    except UnknownAgent as exc:
        return None, f"{exc}; deploy it or migrate the run", True
    if agent.topology_hash != run.topology_hash:
        return None, (
            f"agent {agent.name!r} v{agent.version} changed its steps since this run started "
            f"(topology {run.topology_hash[:12]} -> {agent.topology_hash[:12]}); register the "
            "new steps as a new version and keep this one until its runs drain"), False
    return agent, "", False


def branch_claim(*, run_id: UUID, index: int, owner: str) -> Branch | None:
    """Take the branch's lease (epoch + 1, database clock) if it is pending or its holder's
    lease expired, in one statement; counts the attempt."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            UPDATE {Branch._meta.db_table} b
               SET status = 'running', lease_owner = %s, lease_epoch = b.lease_epoch + 1,
                   lease_expires_at = now() + %s, attempts = b.attempts + 1
             WHERE b.id = (SELECT id FROM {Branch._meta.db_table}
                            WHERE run_id = %s AND index = %s
                              AND status IN ('pending', 'running')
                            ORDER BY visit DESC LIMIT 1)
               AND (b.status = 'pending'
                    OR (b.status = 'running' AND b.lease_expires_at < now()))
         RETURNING b.id
            """,
            [owner, timedelta(seconds=settings.RUN_LEASE_SECONDS), run_id, index],
        )
        row = cursor.fetchone()
    return Branch.objects.get(id=row[0]) if row else None


def branch_release(branch: Branch, *, reason: str, retry_seconds: float | None) -> Outcome:
    """Give the branch back, pending and uncounted: in line again after `retry_seconds` for a
    worker that has its agent's code, or (None) out of line until the run is migrated."""
    with transaction.atomic():
        released = Branch.objects.filter(id=branch.id, lease_epoch=branch.lease_epoch).update(
            status=Branch.Status.PENDING, lease_owner="", lease_expires_at=None,
            attempts=F("attempts") - 1)
        if not released:
            raise LeaseLost(f"branch {branch.index} of run {branch.run_id} was taken over")
        if retry_seconds is not None:
            deferred_for = ready_defer(run_id=branch.run_id, branch=branch.index,
                                       delay_seconds=retry_seconds)
            if deferred_for <= settings.RUN_UNKNOWN_AGENT_GRACE_SECONDS:
                return Outcome.DEFERRED
        ready_clear(run_id=branch.run_id, branch=branch.index)
        Run.objects.filter(id=branch.run_id, status=Run.Status.WAITING).update(
            waiting_reason=f"fan_out: branch {branch.index} refused: {reason}")
        event_record(run_id=branch.run_id, kind="resume_refused", visit=branch.visit,
                     branch=branch.index, reason=reason)
    return Outcome.PARKED


def branch_advance(*, run_id: UUID, index: int, owner: str | None = None,
                   sleep=time.sleep) -> Outcome:
    """Run one fan-out branch; its result is a pending write. The last branch to finish puts
    the run back in line for its join step, in the same transaction."""
    owner = owner or worker_id()
    branch = branch_claim(run_id=run_id, index=index, owner=owner)
    if branch is None:
        return Outcome.NOT_CLAIMED
    run = Run.objects.get(id=run_id)
    if run.status != Run.Status.WAITING:
        return _branch_finish(branch, ok=False, error=f"run is {run.status}")
    if branch.attempts > settings.RUN_MAX_CLAIMS_WITHOUT_CHECKPOINT:  # a branch cannot park
        event_record(run_id=run.id, kind="poison_step", visit=branch.visit, branch=index)
        return _branch_finish(branch, ok=False, error=_poison_reason(
            claims=branch.attempts - 1, step=branch.step, where=f"branch {index}"))
    agent, refusal, unknown_here = agent_for(run)
    if refusal:  # refused branches stay pending: for a worker that has the code, or a migrate
        return branch_release(branch, reason=refusal, retry_seconds=(
            settings.RUN_UNKNOWN_AGENT_RETRY_SECONDS if unknown_here else None))
    lease = {"schema": connection.schema_name, "table": Branch._meta.db_table,
             "row_id": branch.id}
    leases.hold(epoch=branch.lease_epoch, **lease)
    try:
        step = agent.steps[branch.step]
        checkpoint = run.checkpoints.get(visit=branch.visit)
        position = Position(visit=branch.visit, step=branch.step, state=checkpoint.state,
                            offsets=dict(checkpoint.log_offsets), handed_over=True)
        harness = Harness(run, agent, epoch=-1, owner=owner, slice_seconds=0, sleep=sleep)
        harness.position = position
        logs = {name: LogView(run.id, name, lambda name=name: position.offsets.get(name, 0),
                              lambda name: []) for name in agent.logs}
        harness.item, harness.branch = branch.item, branch
        try:
            transition = harness._step_run(step, position, logs)
        except (StepError, NeedsPerson, BudgetExceeded) as exc:  # a branch cannot park
            return _branch_finish(branch, ok=False, error=f"{type(exc).__name__}: {exc}")
        finally:
            harness.writer.close()
        if harness.notifications:
            return _branch_finish(branch, ok=False, error=(
                f"branch step {step.name!r} used ctx.notify; branches have no checkpoint to "
                "commit it with: use ctx.effect, or notify from the join step"))
        match transition:
            case Finish(result=result, update=update, append=append) if not update and not append:
                return _branch_finish(branch, ok=True, value=result)
            case Fail(reason=reason):
                return _branch_finish(branch, ok=False, error=reason)
            case None:
                return _branch_finish(branch, ok=False, error=harness._last_error)
        return _branch_finish(branch, ok=False, error=(
            f"branch step {step.name!r} must return finish(value) or fail(reason), "
            f"not {type(transition).__name__} with state changes"))
    finally:
        leases.release(**lease)


def _branch_finish(branch: Branch, *, ok: bool, value: Any = None, error: str = "") -> Outcome:
    with transaction.atomic():
        Run.objects.select_for_update().filter(id=branch.run_id).first()  # serialise the last two
        written = Branch.objects.filter(id=branch.id, lease_epoch=branch.lease_epoch).update(
            status=Branch.Status.DONE if ok else Branch.Status.FAILED, result=value, error=error,
            lease_owner="", lease_expires_at=None, finished_at=timezone.now(),
        )
        if not written:
            raise LeaseLost(f"branch {branch.index} of run {branch.run_id} was taken over")
        ready_clear(run_id=branch.run_id, branch=branch.index)
        open_branches = Branch.objects.filter(
            run_id=branch.run_id, visit=branch.visit,
            status__in=[Branch.Status.PENDING, Branch.Status.RUNNING]).exists()
        # A late report wakes no other wait: the run must still be parked at this join.
        parked = Checkpoint.objects.filter(run_id=branch.run_id).order_by("-visit").first()
        still_joining = parked is not None and parked.visit == branch.visit and \
            (parked.waiting or {}).get("kind", "fan_out") == "fan_out"
        if not open_branches and still_joining:
            resumed = Run.objects.filter(id=branch.run_id, status=Run.Status.WAITING).update(
                status=Run.Status.QUEUED, waiting_reason="", updated_at=timezone.now())
            if resumed:
                event_record(run_id=branch.run_id, kind="fan_in", visit=branch.visit)
                ready_mark(run_id=branch.run_id)
    return Outcome.ENDED
