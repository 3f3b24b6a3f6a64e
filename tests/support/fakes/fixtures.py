"""Pytest fixtures for the fakes. Use from a conftest: `from tests.support.fakes.fixtures import *`."""

import pytest

from .anthropic import FakeAnthropic
from .openai import FakeOpenAI
from .slack import FakeSlack
from .smtp import SMTPServer
from .stripe import FakeStripe
from .webhook import FakeWebhook

__all__ = ["fake_anthropic", "fake_openai", "fake_slack", "fake_stripe", "fake_webhook", "smtp_server"]


@pytest.fixture
def fake_slack():
    server = FakeSlack().start()
    yield server
    server.stop()


@pytest.fixture
def fake_stripe():
    server = FakeStripe().start()
    yield server
    server.stop()


@pytest.fixture
def fake_openai():
    server = FakeOpenAI().start()
    yield server
    server.stop()


@pytest.fixture
def fake_anthropic():
    server = FakeAnthropic().start()
    yield server
    server.stop()


@pytest.fixture
def smtp_server():
    server = SMTPServer().start()
    yield server
    server.stop()


@pytest.fixture
def fake_webhook():
    server = FakeWebhook().start()
    yield server
    server.stop()
