"""The fakes run as their own processes too (for workers and benchmarks), and report over HTTP."""

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from integrations.connectors import connector_get
from tests.support.fakes.smtp import free_port
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]


def fake_process(name: str):
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", f"tests.support.fakes.{name}", "--port", str(port)],
                               cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: _get(f"{url}/_fake/state") is not None, timeout=20, what=f"fake {name} to listen")
    return process, url


def _get(url):
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return json.load(answer)
    except OSError:
        return None


def _post(url, body: dict):
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(request, timeout=5) as answer:
        return json.load(answer)


@pytest.mark.parametrize("name", ["stripe", "slack", "openai", "webhook"])
def test_a_fake_runs_standalone_and_reports_its_state(name, call):
    process, url = fake_process(name)
    try:
        state = _get(f"{url}/_fake/state")
        assert state is not None
        if name == "stripe":
            attempt = call({"amount": 500, "currency": "eur", "source": "tok_visa"},
                           {"secret_key": "sk_test_x", "api_url": url}, key="standalone-1")
            connector_get("payments").execute(attempt)
            connector_get("payments").execute(attempt)
            assert _get(f"{url}/_fake/state")["charges_by_key"] == {"standalone-1": 1}
            assert _post(f"{url}/_fake/config", {"delay": 0.1}) == {"ok": True}
            _post(f"{url}/_fake/reset", {})
            assert _get(f"{url}/_fake/state")["charges"] == 0
    finally:
        process.terminate()
        process.wait(timeout=10)
