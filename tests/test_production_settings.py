"""Production settings, read in a fresh process from a production-like environment: Django's
deploy checks pass, cookies are secure, HTTPS is known behind a TLS proxy (so webhook URLs given
to Slack and Gmail say https), and nothing secret falls back to a value in the repository."""

import base64
import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_ENV = ROOT / "deploy" / "production" / "agentplatform.env.example"

PRODUCTION = {
    "DJANGO_DEBUG": "0",
    "DJANGO_ALLOWED_HOSTS": "agents.example.com",
    "DJANGO_BEHIND_TLS_PROXY": "1",
    "DJANGO_HSTS_PRELOAD": "1",
    "AGENTPLATFORM_MASTER_KEY": base64.b64encode(os.urandom(32)).decode(),
}

SETTINGS_PROBE = """
import json, uuid
from types import SimpleNamespace
import django
django.setup()
from django.conf import settings
from django.test import RequestFactory
from integrations.webhooks.api import GmailConnectionSerializer, SlackConnectionSerializer

request = RequestFactory().post("/api/v1/connections/slack", HTTP_HOST="agents.example.com",
                                HTTP_X_FORWARDED_PROTO="https")
connection = SimpleNamespace(id=uuid.uuid4())
slack = SlackConnectionSerializer(context={"request": request})
print(json.dumps({
    "events_url": slack.get_events_url(connection),
    "push_url": GmailConnectionSerializer(context={"request": request}).get_push_url(connection),
    "cookies": [settings.SESSION_COOKIE_SECURE, settings.CSRF_COOKIE_SECURE,
                settings.SESSION_COOKIE_HTTPONLY, settings.CSRF_COOKIE_HTTPONLY,
                settings.SESSION_COOKIE_SAMESITE, settings.CSRF_COOKIE_SAMESITE],
    "s3": [settings.AWS_ACCESS_KEY_ID, settings.AWS_SECRET_ACCESS_KEY],
    "hasher": settings.PASSWORD_HASHERS[0],
}))
"""


def run(args, **env):
    # Only what is given here (and .env, which holds no S3 credentials): not the test settings.
    environment = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp"),
                   "DJANGO_SETTINGS_MODULE": "agentplatform.settings",
                   "DJANGO_SECRET_KEY": secrets.token_urlsafe(50), **PRODUCTION, **env}
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=environment,
                          capture_output=True, text=True, timeout=120)


def test_deploy_checks_pass_their_security_checks():
    checked = run(["manage.py", "check", "--deploy", "--tag", "security", "--fail-level",
                   "WARNING"])
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "security." not in checked.stdout + checked.stderr


def example_environment() -> dict[str, str]:
    """deploy/production's example environment file, as systemd and `docker --env-file` read it."""
    lines = [line for line in EXAMPLE_ENV.read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    return dict(line.split("=", 1) for line in lines)


def test_deploy_checks_are_clean_with_the_example_production_environment(tmp_path):
    environment = {**example_environment(), "DJANGO_SECRET_KEY": secrets.token_urlsafe(50),
                   "AGENTPLATFORM_MASTER_KEY": base64.b64encode(os.urandom(32)).decode(),
                   "STATIC_ROOT": str(tmp_path)}
    assert environment["DJANGO_DEBUG"] == "0" and environment["STATIC_COLLECTED"] == "1"
    checked = run(["manage.py", "check", "--deploy", "--fail-level", "WARNING"], **environment)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "System check identified no issues (0 silenced)" in checked.stdout


def test_the_example_environment_leaves_the_secrets_to_be_filled_in():
    environment = example_environment()
    assert environment["DJANGO_SECRET_KEY"] == environment["AGENTPLATFORM_MASTER_KEY"] == ""
    started = run(["-c", "import django; django.setup()"],
                  **{**environment, "DJANGO_SECRET_KEY": ""})
    assert started.returncode != 0 and "DJANGO_SECRET_KEY is not set" in started.stderr


def test_cookies_are_secure_and_webhook_urls_are_https_behind_a_tls_proxy():
    probed = run(["-c", SETTINGS_PROBE])
    assert probed.returncode == 0, probed.stderr
    values = json.loads(probed.stdout.strip().splitlines()[-1])
    assert values["events_url"].startswith("https://agents.example.com/webhooks/slack/")
    assert values["push_url"].startswith("https://agents.example.com/webhooks/gmail/")
    assert values["cookies"] == [True, True, True, True, "Lax", "Lax"]


def test_no_default_s3_credentials_outside_the_dev_command():
    probed = run(["-c", SETTINGS_PROBE])
    assert probed.returncode == 0, probed.stderr
    assert json.loads(probed.stdout.strip().splitlines()[-1])["s3"] == [None, None]


def test_a_missing_secret_key_fails_at_start_even_with_debug():
    for debug in ("0", "1"):
        started = run(["-c", "import django; django.setup()"], DJANGO_SECRET_KEY="",
                      DJANGO_DEBUG=debug)
        assert started.returncode != 0, f"DJANGO_DEBUG={debug} started without a secret key"
        assert "DJANGO_SECRET_KEY is not set" in started.stderr


def test_people_passwords_are_hashed_with_django_argon2id_at_its_own_costs():
    """The suite signs people in with a cheaper Argon2 (tests/support/hashers.py); production
    uses Django's, whose costs are made to be slow."""
    probed = run(["-c", SETTINGS_PROBE])
    assert probed.returncode == 0, probed.stderr
    hasher = json.loads(probed.stdout.strip().splitlines()[-1])["hasher"]
    assert hasher == "django.contrib.auth.hashers.Argon2PasswordHasher"
