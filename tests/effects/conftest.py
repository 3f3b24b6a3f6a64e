"""Receivers the effect tests send to: one that deduplicates by Idempotency-Key (like Stripe)
and a plain one that acts on every request (like SMTP or Slack's chat.postMessage)."""

import pytest

from tests.effects.receiver import Receiver


@pytest.fixture
def receiver():
    server = Receiver()
    yield server
    server.close()


@pytest.fixture
def plain_receiver():
    server = Receiver(dedupe=False)
    yield server
    server.close()
