"""The web process as deployed (deploy/production): gunicorn with its config, the production
settings with DEBUG off, and static files collected into STATIC_ROOT: pages come styled, their
stylesheets served by the platform itself (whitenoise), compressed, under content-hashed names
cached for good."""

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from tests.support.fakes.smtp import free_port
from tests.support.waiting import wait_for
from tests.test_production_settings import PRODUCTION, run

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "deploy" / "production" / "gunicorn.conf.py"
UNITS = ROOT / "deploy" / "production" / "systemd"
HOST = {"Host": "agents.example.com", "X-Forwarded-Proto": "https"}  # as the TLS proxy sends


@pytest.fixture(scope="module")
def web(tmp_path_factory, django_db_setup):
    static_root = tmp_path_factory.mktemp("static")
    env = {"STATIC_COLLECTED": "1", "STATIC_ROOT": str(static_root),
           # the test session's database and Redis, not a developer's
           "DATABASE_URL": os.environ["DATABASE_URL"],
           "CELERY_BROKER_URL": os.environ["CELERY_BROKER_URL"]}
    collected = run(["manage.py", "collectstatic", "--noinput"], **env)
    assert collected.returncode == 0, collected.stdout + collected.stderr
    port = free_port()
    log = tmp_path_factory.mktemp("gunicorn") / "gunicorn.log"
    process = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "-c", str(CONFIG)], cwd=ROOT,
        env={"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp"),
             "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
             "DJANGO_SETTINGS_MODULE": "agentplatform.settings",
             "DJANGO_SECRET_KEY": "production-layout-" + "x" * 50, **PRODUCTION, **env,
             "WEB_BIND": f"127.0.0.1:{port}", "WEB_CONCURRENCY": "1"},
        stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"

    def answering():
        assert process.poll() is None, log.read_text()[-3000:]
        try:
            return requests.get(f"{url}/healthz", headers=HOST, timeout=2).status_code == 200
        except (requests.ConnectionError, requests.Timeout):  # not listening, or still loading
            return False

    try:
        wait_for(answering, timeout=60, interval=0.2, what="gunicorn to answer")
        yield url
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)


def stylesheets(page: str) -> list[str]:
    return re.findall(r'<link rel="stylesheet"[^>]*href="([^"]+)"', page)


@pytest.mark.parametrize("path", ["/admin/login/", "/login"])
def test_pages_are_styled_under_gunicorn_with_debug_off(web, path):
    page = requests.get(f"{web}{path}", headers=HOST, timeout=10)
    assert page.status_code == 200, page.text[:500]
    sheets = stylesheets(page.text)
    assert sheets, f"{path} links no stylesheet"
    for href in sheets:
        # content-hashed by collectstatic's manifest: browsers may keep it for good
        assert re.search(r"\.[0-9a-f]{12}\.css$", href), href
        sheet = requests.get(f"{web}{href}", headers={**HOST, "Accept-Encoding": "gzip"},
                             timeout=10)
        assert sheet.status_code == 200, href
        assert sheet.headers["Content-Type"].startswith("text/css")
        assert "immutable" in sheet.headers["Cache-Control"]
        assert sheet.text.strip()


def test_static_files_are_served_compressed(web):
    page = requests.get(f"{web}/admin/login/", headers=HOST, timeout=10)
    base = next(href for href in stylesheets(page.text) if "/admin/css/base." in href)
    sheet = requests.get(f"{web}{base}", headers={**HOST, "Accept-Encoding": "gzip"}, timeout=10,
                         stream=True)
    assert sheet.headers.get("Content-Encoding") == "gzip"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
def test_the_systemd_units_verify():
    verified = subprocess.run(["systemd-analyze", "verify", "--man=no",
                               *sorted(str(unit) for unit in UNITS.iterdir())],
                              capture_output=True, text=True, timeout=60)
    problems = [line for line in verified.stderr.splitlines() if line.strip()
                and "is not executable" not in line  # /opt/agentplatform is not installed here
                and "Unknown key 'DelegateSubgroup'" not in line]  # systemd < 254 ignores it
    assert problems == []
