"""A URL's credentials and secret parts never reach what tenants and operators read: connector
errors, effect rows, run events, the run's error, outbox rows and log lines."""

import io
import json
import logging

import pytest

from agentplatform.redaction import secrets_redact
from integrations.services import credential_set
from runs import engine
from runs.effects.models import Effect, OutboxMessage
from runs.models import Run, RunEvent
from tests.support.runs import start
from tests.support.waiting import wait_for

SECRETS = ("hunter2", "T0ACME", "B0HOOK", "s3cr3tPathToken0123456789", "tok_live_x1y2")
# port 9 (discard): nothing listens on this machine, so every attempt fails to connect
URL = ("http://bob:hunter2@127.0.0.1:9/services/T0ACME/B0HOOK/s3cr3tPathToken0123456789"
       "?token=tok_live_x1y2&page=2")


def finished(run_id):
    """Advance a run no worker was asked for (`start`) to its end in this process, its
    retries without their waits."""
    outcome = engine.advance(run_id=run_id, sleep=lambda s: None)
    while outcome == engine.Outcome.SLICE_USED:
        outcome = engine.advance(run_id=run_id, sleep=lambda s: None)
    return Run.objects.get(id=run_id)


def assert_no_secret(text: str, where: str) -> None:
    leaked = [secret for secret in SECRETS if secret in text]
    assert not leaked, f"{where} shows {leaked}: {text[:600]}"


@pytest.mark.parametrize("text, kept, gone", [
    ("cannot connect to https://bob:hunter2@hooks.example.com/x", "hooks.example.com/x", "hunter2"),
    ("https://hooks.slack.com/services/T0ACME/B0HOOK/abcdefghijklmnopqrstuvwx", "hooks.slack.com",
     "abcdefghijkl"),
    ("GET https://api.example.com/v1/x?token=abc123&key=k9&sig=zzz9", "api.example.com/v1/x",
     "abc123"),
    ("bob:hunter2@smtp.example.com:587 said no", "smtp.example.com:587", "hunter2"),
    ("bob:" + "p4ss" * 64 + "@smtp.example.com said no", "smtp.example.com", "p4ss"),
    ("Authorization: Bearer sk-abcdefghijklmnopqrstu", "Authorization", "sk-abcdef"),
    ("slack said invalid_auth for xoxb-1234-5678-abcdef", "invalid_auth", "xoxb-1234"),
    # a password with a quote, a space or a '<' (a URL's repr, a sentence) is still userinfo
    (repr("https://user:pa'ss@hook.example.com:99999/"), "hook.example.com", "ss@"),
    (repr("ftp://user:pa ss@hook.example.com/"), "hook.example.com/", "ss@"),
    ("could not reach https://user:pa<ss@h.example.com/", "h.example.com/", "ss@"),
    ("could not reach https://user:pa\"ss@h.example.com/x", "h.example.com/x", "ss@"),
    # a request line without scheme or host keeps its path, not its query values
    ("GET /hook?token=SUPERSECRET1234&page=2 failed", "GET /hook?token=", "SUPERSECRET1234"),
    # a token of letters only
    ("https://h.example.com/hooks/abcdefghijklmnopqrstuvwxyzabcdef", "h.example.com/hooks/",
     "abcdefghijklmnopqrstuvwxyzabcdef"),
])
def test_secrets_are_redacted_from_texts(text, kept, gone):
    redacted = secrets_redact(text)
    assert kept in redacted and gone not in redacted and "[redacted]" in redacted


def test_a_plain_error_text_is_left_alone():
    text = "email: SMTP server said 550 user@example.com unknown; step 'a' raised ValueError: 3:4"
    assert secrets_redact(text) == text
    for text in ("webhook: cannot connect to https://hooks.example.com:443/hooks/order-paid: "
                 "timed out", "a/b?c is a path, 1/2 a fraction"):
        assert secrets_redact(text) == text


def test_a_failing_effects_url_secrets_are_in_no_row_event_or_api_answer(in_acme, acme_api):
    credential_set(connector="webhook", secrets={"signing_secret": "whsec_test"})
    # advanced here, its retries without their waits (no worker takes it: it is not in line)
    run = finished(start("payer", input={"url": URL, "amount": 5, "connector": "webhook"}).id)
    assert run.status == "failed" and "cannot connect to http://" in run.error
    assert "127.0.0.1:9" in run.error  # the destination is still named
    assert_no_secret(run.error, "the run's error")
    effect = Effect.objects.get(run=run, name="charge")
    assert effect.error
    assert_no_secret(effect.error, "the effect row")
    events = list(RunEvent.objects.filter(run=run).values_list("data", flat=True))
    assert any("traceback" in data for data in events)
    assert_no_secret(json.dumps(events), "the run's events")
    # what the API shows of them (the run's input is the tenant's own, shown as given)
    answer = acme_api.get(f"/api/v1/runs/{run.id}").json()
    assert answer["error"] == run.error
    answer = acme_api.get(f"/api/v1/runs/{run.id}/events").json()
    shown = [{k: v for k, v in e["data"].items() if k in ("error", "traceback")}
             for e in answer["results"]]
    assert any(shown)
    assert_no_secret(json.dumps(shown), "GET /runs/{id}/events")
    answer = acme_api.get(f"/api/v1/runs/{run.id}/effects").json()
    assert [e["error"] for e in answer["effects"]] == [effect.error]


def test_a_failing_notifications_secrets_are_not_in_its_outbox_row(in_acme, acme_api,
                                                                   outbox_worker):
    credential_set(connector="webhook", secrets={"signing_secret": "whsec_test"})
    run = finished(start("herald", input={"url": URL, "notes": 1, "connector": "webhook"}).id)
    assert run.status == "succeeded"
    wait_for(lambda: OutboxMessage.objects.filter(run=run).exclude(last_error="").exists(),
             timeout=30, what="the outbox worker's first failed delivery")
    message = OutboxMessage.objects.get(run=run)
    assert "cannot connect" in message.last_error
    assert_no_secret(message.last_error, "the outbox row")
    answer = acme_api.get("/api/v1/outbox", {"run": str(run.id)}).json()
    assert [m["last_error"] for m in answer["results"]] == [message.last_error]


def test_log_lines_are_redacted_by_the_configured_handlers():
    handlers = [h for h in logging.getLogger().handlers if isinstance(h, logging.StreamHandler)
                and type(h).__module__ == "logging"]
    assert handlers, "the LOGGING console handler is installed"
    stream = io.StringIO()
    previous = handlers[0].setStream(stream)
    try:
        logging.getLogger("runs.effects.services").warning("outbox 7 attempt 1 failed: %s", URL)
        try:
            raise ConnectionError(f"while posting to {URL}")
        except ConnectionError:
            logging.getLogger("runs.effects.services").exception("lookup failed")
    finally:
        handlers[0].setStream(previous)
    text = stream.getvalue()
    assert "outbox 7 attempt 1 failed: http://[redacted]@127.0.0.1:9/" in text
    assert "ConnectionError" in text
    assert_no_secret(text, "the log")
