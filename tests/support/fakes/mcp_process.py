"""The local MCP server (tests/support/fakes/mcp_server.py) as a subprocess on a free port, and
its `/_fake/` state, for tests in this process and workers in others. Kept apart from the server
so that a test importing the fixtures does not import the MCP server stack."""

import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


class McpServerProcess:
    """The server as a subprocess on a free port (what a worker in another process reaches)."""

    def __init__(self, port: int, token: str = ""):
        self.port, self.token = port, token
        self.url = f"http://127.0.0.1:{port}/mcp"
        self.base = f"http://127.0.0.1:{port}"
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 30) -> "McpServerProcess":
        command = [sys.executable, "-m", "tests.support.fakes.mcp_server", "--port", str(self.port)]
        if self.token:
            command += ["--token", self.token]
        self.log = tempfile.TemporaryFile()  # a file, not a pipe: a full pipe would stall it
        self.process = subprocess.Popen(command, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                                        stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.state()
                return self
            except OSError:
                if self.process.poll() is not None:
                    self.log.seek(0)
                    output = self.log.read().decode(errors="replace")[-2000:]
                    raise RuntimeError(f"mcp server exited: {output}") from None
                if time.monotonic() > deadline:
                    raise TimeoutError("the mcp server did not start") from None
                time.sleep(0.1)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def _fake(self, method: str, path: str, body: dict | None = None) -> dict:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.base}/_fake/{path}", data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=5) as answer:
            return json.loads(answer.read())

    def state(self) -> dict:
        return self._fake("GET", "state")

    def reset(self) -> None:
        self._fake("POST", "reset", {})

    def configure(self, **changes) -> None:
        self._fake("POST", "config", changes)
