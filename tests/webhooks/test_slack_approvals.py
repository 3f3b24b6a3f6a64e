"""The Slack approval message: Block Kit built from the approval alone; sent via the outbox."""

import logging
import uuid
from datetime import UTC, datetime
from types import SimpleNamespace

from webhooks.slack_approvals import approval_message_build, slack_approval_announce


def approval(**request):
    return SimpleNamespace(id=uuid.uuid4(), run_id=uuid.uuid4(), deciders=["U0MARIA"],
                           expires_at=datetime(2030, 1, 2, 9, 30, tzinfo=UTC),
                           request={"title": "Day-one schedule for Ada", "body": "Please check.",
                                    "artifact": {"09:00": "Welcome"}, **request})


def test_message_has_title_artifact_and_buttons_carrying_the_approval_id():
    pending = approval()
    message = approval_message_build(approval=pending, channel="C0APPROVALS")
    assert message["channel"] == "C0APPROVALS"
    assert message["text"] == "Approval requested: Day-one schedule for Ada"
    section, artifact, context, actions = message["blocks"]
    assert "*Day-one schedule for Ada*" in section["text"]["text"]
    assert '"09:00": "Welcome"' in artifact["text"]["text"]
    assert "U0MARIA" in context["elements"][0]["text"] and "2030-01-02 09:30" in \
        context["elements"][0]["text"]
    buttons = {b["action_id"]: b for b in actions["elements"]}
    assert set(buttons) == {"approve", "reject"}
    assert {b["value"] for b in buttons.values()} == {str(pending.id)}
    assert buttons["approve"]["style"] == "primary" and buttons["reject"]["style"] == "danger"


def test_large_artifacts_are_cut_to_fit_a_section():
    message = approval_message_build(approval=approval(artifact="x" * 10_000), channel="C1")
    assert len(message["blocks"][1]["text"]["text"]) <= 3000


def test_announcer_is_registered_and_without_an_outbox_only_logs(in_acme, caplog):
    from approvals.models import Approval
    from approvals.services import ANNOUNCERS
    from runs.services import run_cancel, run_start
    from webhooks.services import slack_connection_create

    assert slack_approval_announce in ANNOUNCERS
    slack_connection_create(tenant=in_acme, team_id=f"T{uuid.uuid4().hex[:10].upper()}",
                            signing_secret="s", approvals_channel="C0APPROVALS")
    run = run_start(agent="waiter", input={"how": "approval"}, enqueue=False).run
    pending = Approval.objects.create(run=run, visit=1, request={"title": "Ship it?"}, then="x")
    with caplog.at_level(logging.INFO, logger="webhooks.slack_approvals"):
        slack_approval_announce(pending.id)  # effects.services does not exist on this branch
    try:
        import effects.services  # noqa: F401
    except ImportError:
        assert "Slack announcement skipped" in caplog.text
    run_cancel(run_id=run.id)
