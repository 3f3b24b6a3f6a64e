"""A live HTTP server for tests: `manage.py runserver` as a process of its own (its own process
group), on a free port, with the test settings and whatever environment a test adds (an SMTP
server's address, say). Browsers and printed commands talk to it as they would to a deployment."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import requests
from django.conf import settings

from tests.settings import SLOT
from tests.support.fakes.smtp import free_port
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parent.parent.parent
LOGS = ROOT / ".dev" / "test-logs" / f"slot{SLOT}"


class LiveServer:
    """`LiveServer(ready_path=..., env={...}).start()`; `.url`; `.stop()` ends its process group."""

    def __init__(self, *, name: str = "live-server", ready_path: str = "/healthz",
                 env: dict[str, str] | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.ready_path = ready_path
        self.log = LOGS / f"{name}.log"
        self.log.parent.mkdir(parents=True, exist_ok=True)
        # --insecure: serve static files (stylesheets, scripts) with DEBUG off, as tests run
        self.process = subprocess.Popen(
            [sys.executable, "manage.py", "runserver", "--noreload", "--insecure",
             f"127.0.0.1:{self.port}"],
            cwd=ROOT, env={**os.environ, "DJANGO_SETTINGS_MODULE": settings.SETTINGS_MODULE,
                           **(env or {})},
            stdout=self.log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)

    def answering(self) -> bool:
        assert self.process.poll() is None, self.log_tail()
        try:
            return requests.get(f"{self.url}{self.ready_path}", timeout=2).status_code == 200
        except requests.ConnectionError:
            return False

    def start(self, timeout: float = 60) -> "LiveServer":
        try:
            wait_for(self.answering, timeout=timeout, interval=0.2,
                     what=f"the live server to answer {self.ready_path}")
        except BaseException:
            self.stop()
            raise
        return self

    def log_tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    def stop(self):
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=5)
