"""Draining a worker for a deploy: on SIGTERM, a run's time slice ends after its current step.

Celery's warm shutdown (SIGTERM to the main process) stops taking messages and waits for the
tasks in progress, so a pool process driving a run would go on for its whole slice
(RUN_SLICE_SECONDS); and a pool process that gets SIGTERM itself (systemd's default KillMode and
a terminal's Ctrl-C reach the whole group) would exit mid-step, its run waiting out the lease
TTL. Here a pool process running a task takes SIGTERM as "drain": the run's slice ends after the
step in progress, which checkpoints the run, gives its lease back and puts it in line for
another worker at once. An idle pool process keeps billiard's handler and exits. The main
process passes SIGTERM on to the pool processes running tasks (agentplatform.celery), so
`kill <pid>` and `docker stop` drain as well; a threads or solo worker's tasks see the flag.
"""

import os
import signal
import threading

from celery.worker import state as worker_state

draining = threading.Event()
_pool_process = False  # set in prefork pool processes, whose main thread runs the tasks
_idle_sigterm = None  # billiard's SIGTERM handler, put back between tasks


class DrainableSlice(float):
    """A run's slice length, in seconds, used up as soon as this process drains. The engine's
    step loop asks `elapsed >= slice` after each step, and Python asks the float subclass on
    the right first (its reflected `__le__`)."""

    def __le__(self, elapsed) -> bool:
        return draining.is_set() or float(self) <= elapsed


def _sigterm_drain(signum, frame) -> None:
    draining.set()


def pool_process_started() -> None:
    global _pool_process
    _pool_process = True


def task_started() -> None:
    """In a pool process, SIGTERM drains while a task runs (billiard installs its own handler
    after the process starts, so it is swapped here, per task)."""
    global _idle_sigterm
    if _pool_process:
        _idle_sigterm = signal.signal(signal.SIGTERM, _sigterm_drain)


def task_ended() -> None:
    if _pool_process and _idle_sigterm is not None:
        signal.signal(signal.SIGTERM, _idle_sigterm)


def worker_drain() -> None:
    """The main process is shutting down: tasks it runs itself (threads, solo) drain, and each
    pool process running a task is told with SIGTERM (at most a repeat of what it got)."""
    draining.set()
    for request in list(worker_state.active_requests):
        if request.worker_pid and request.worker_pid != os.getpid():
            try:
                os.kill(request.worker_pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
