import uuid

import pytest

from integrations.connectors import Call
from tests.support.fakes.fixtures import *  # noqa: F403  (fake_slack, fake_stripe, fake_openai, fake_webhook, smtp_server)


@pytest.fixture
def call():
    """Make a Call the way the effect ledger does: a fresh, stable key per effect."""

    def make(args: dict, credentials: dict | None = None, *, key: str | None = None) -> Call:
        run_id = uuid.uuid4()
        return Call(tenant="acme", run_id=run_id, effect="effect", args=args,
                    idempotency_key=key or f"{run_id}:1:effect", credentials=credentials or {})

    return make
