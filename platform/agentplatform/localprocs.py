"""Celery worker and beat processes on this machine, started by tests and benchmarks.

Each runs in its own session (process group), so it can be killed whole, like a lost host.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from django.conf import settings

ROOT = Path(__file__).resolve().parents[2]  # platform/<package>/ -> the checkout


def wait_for(predicate, *, timeout: float = 20.0, interval: float = 0.05, what: str = "condition"):
    """Wait on a condition with a deadline, instead of sleeping and hoping."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


class CeleryProcess:
    """`prefix`: a command the process runs under, e.g. `ip netns exec <ns>` for a worker on a
    simulated host of its own (bench/partition.py)."""

    def __init__(self, name: str, args: list[str], *, log_dir: Path, env: dict | None = None,
                 prefix: list[str] | None = None):
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        # this process's settings module (under override_settings, settings.SETTINGS_MODULE
        # is None: the environment's is the one it was loaded from)
        module = os.environ.get("DJANGO_SETTINGS_MODULE") or settings.SETTINGS_MODULE
        environment = {**os.environ, "DJANGO_SETTINGS_MODULE": module, **(env or {})}
        self.process = subprocess.Popen(
            [*(prefix or []), sys.executable, "-m", "celery", "-A", "agentplatform", *args],
            cwd=ROOT, env=environment, stdout=self.log_path.open("wb"),
            stderr=subprocess.STDOUT, start_new_session=True,
        )

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def log_count(self, text: str) -> int:
        return self.log_path.read_text(errors="replace").count(text)

    def kill(self, sig=signal.SIGKILL):
        try:
            os.killpg(self.process.pid, sig)
        except ProcessLookupError:
            pass
        self.process.wait(timeout=30)

    def stop(self):
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()


class Worker(CeleryProcess):
    """A real `celery worker` on the given queues (default: the runs' queue, prefork)."""

    def __init__(self, name: str, concurrency: int = 1, *, log_dir: Path, env: dict | None = None,
                 queues: list[str] | None = None, pool: str = "prefork",
                 prefix: list[str] | None = None):
        queues = queues or [settings.CELERY_TASK_DEFAULT_QUEUE]
        super().__init__(name, ["worker", "-l", "info", "-Q", ",".join(queues),
                                "-n", f"{name}@%h", "--pool", pool, "-c", str(concurrency),
                                "--without-gossip", "--without-mingle"], log_dir=log_dir, env=env,
                         prefix=prefix)

    @classmethod
    def outbox(cls, name: str, concurrency: int = 8, *, log_dir: Path,
               env: dict | None = None, prefix: list[str] | None = None) -> "Worker":
        """A worker for outbox deliveries only: threads, since deliveries wait on receivers."""
        queue = (env or {}).get("CELERY_OUTBOX_QUEUE", settings.CELERY_OUTBOX_QUEUE)
        return cls(name, concurrency, log_dir=log_dir, env=env, queues=[queue], pool="threads",
                   prefix=prefix)

    def wait_ready(self, timeout: float = 60.0):
        # Not at the top: importing the Celery app picks a settings module, and benchmarks
        # choose theirs after importing this module.
        from agentplatform.celery import app

        def answers():
            assert self.process.poll() is None, f"worker {self.name} exited: {self.log_tail()}"
            replies = app.control.ping(timeout=0.5) or []
            return any(self.name in host for reply in replies for host in reply)

        wait_for(answers, timeout=timeout, interval=0.2, what=f"worker {self.name} to answer")
        return self

    def pids(self) -> set[int]:
        """The main process and its pool children."""
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
        found = {self.process.pid}
        if children.exists():
            found |= {int(pid) for pid in children.read_text().split()}
        return found


class Beat(CeleryProcess):
    """A real `celery beat`: the watchdog and dispatcher tick (only while it holds the one-beat
    lock: agentplatform/beat.py)."""

    def __init__(self, schedule_dir: Path, *, log_dir: Path, env: dict | None = None,
                 name: str = "beat"):
        super().__init__(name, ["beat", "-l", "info", "-s", str(schedule_dir / "beat-schedule"),
                                  "--pidfile", ""], log_dir=log_dir, env=env)
