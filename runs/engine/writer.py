"""Where a run is (`Position`), and the durability-mode writer that makes positions checkpoints."""

import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypedDict

from django.conf import settings
from django.db import connection
from opentelemetry import context as trace_context

from agentplatform.metrics import checkpoint_write_duration

from ..models import Checkpoint, Run, RunEvent
from .outcome import CheckpointWriteFailed, LeaseLost, StepError
from .store import checkpoint_commit, checkpoint_latest, run_fence


class PendingEntry(TypedDict):
    """A log entry not yet written: a `LogEntry` row's columns but the run's, as the checkpoint
    statement takes them (a dict, dumped as is: no model instance per entry on the step path)."""

    log: str
    index: int
    visit: int
    value: Any


@dataclass
class Position:
    """Where the run is: the checkpoint the engine will write next, kept in memory."""

    visit: int
    step: str | None
    state: dict[str, Any]
    offsets: dict[str, int]
    pending_entries: list[PendingEntry] = field(default_factory=list)
    pending_outbox: list[dict] = field(default_factory=list)  # ctx.notify(...) of the step
    waiting: dict | None = None  # what the run parks on at this checkpoint (Checkpoint.waiting)
    handed_over: bool = False  # given to the writer (committed, in flight, or held)
    state_json: str | None = None  # `state` dumped at the step boundary, if it was (_apply)


def position_load(*, run: Run, checkpoint: Checkpoint | None = None) -> Position:
    """Where the run resumes: `checkpoint` if the caller read it (the claim's transaction
    does), else the run's latest (run_start writes visit 0)."""
    checkpoint = checkpoint or checkpoint_latest(run=run)
    if checkpoint is None:
        raise StepError(f"run {run.id} has no checkpoint to resume from")
    return Position(visit=checkpoint.visit, step=checkpoint.step, state=checkpoint.state,
                    offsets=dict(checkpoint.log_offsets), handed_over=True)


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
        self._touch_due = 0.0  # when the run row is written next (time.perf_counter)
        self._flushing = threading.Lock()
        self.schema = schema = connection.schema_name  # the run's tenant's, for every write
        if self.mode == Run.Durability.ASYNC:
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
            # The trace goes along (only it: copying every context variable would hand the
            # writer thread this thread's database connection), so its statements are the step's.
            self._future = self._executor.submit(self._commit_after, previous, position,
                                                 trace_context.get_current())
            self._in_flight.append(self._future)
        else:
            if self._held is not None:
                position.pending_entries[:0] = self._held.pending_entries
                position.pending_outbox[:0] = self._held.pending_outbox
            self._held = position

    def flush(self) -> None:
        """Make everything handed over so far durable. Thread-safe: a step's effects may run
        in threads of its own (a LangGraph superstep's parallel nodes), each flushing first."""
        with self._flushing:
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
        return [entry["value"] for entry in held if entry["log"] == log_name]

    def commit_final(self, position: Position, *, event: RunEvent | None = None,
                     **run_fields) -> None:
        """Write the checkpoint the run leaves this worker with, together with its run fields
        and `event` (its end's, unsaved: `event_row`), in one statement where it can."""
        self._wait()
        if self._held is not None and self._held is not position:
            position.pending_entries[:0] = self._held.pending_entries
            position.pending_outbox[:0] = self._held.pending_outbox
        if position.handed_over and self._held is None:  # already committed: fields only
            self.cancel_requested |= run_fence(run=self.run, epoch=self.epoch,
                                               visit=position.visit, **run_fields)
            if event is not None:
                event.save(force_insert=True)
        else:
            self._commit(position, event=event, **run_fields)
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

    def _commit_after(self, previous: Future | None, position: Position,
                      traced: trace_context.Context) -> None:
        token = trace_context.attach(traced)
        try:
            if previous is not None:
                previous.result()
            self._commit(position)
        finally:
            trace_context.detach(token)

    def _commit(self, position: Position, event: RunEvent | None = None, **run_fields) -> None:
        started = time.perf_counter()
        # The run row (counters, lease, "progress made") is written with the first checkpoint
        # and then at most every RUN_COUNTERS_SECONDS; the others only lock it to fence.
        touch = started >= self._touch_due
        self.cancel_requested |= checkpoint_commit(
            run=self.run, epoch=self.epoch, position=position, touch_run=touch, event=event,
            schema=self.schema, **run_fields
        )
        if touch:
            self._touch_due = started + settings.RUN_COUNTERS_SECONDS
        checkpoint_write_duration.record(time.perf_counter() - started, {"durability": self.mode})
        position.pending_entries, position.pending_outbox = [], []

