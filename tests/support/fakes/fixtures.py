"""Pytest fixtures for the fakes. Use from a conftest: `from tests.support.fakes.fixtures import *`."""

import pytest

from integrations.scripted_model import server_start

from .openai import FakeOpenAI
from .scripted_model import ScriptedModelFixture
from .slack import FakeSlack
from .smtp import SMTPServer
from .stripe import FakeStripe
from .webhook import FakeWebhook

__all__ = ["fake_openai", "fake_slack", "fake_stripe", "fake_webhook", "scripted_model", "smtp_server"]


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
def smtp_server():
    server = SMTPServer().start()
    yield server
    server.stop()


@pytest.fixture
def fake_webhook():
    server = FakeWebhook().start()
    yield server
    server.stop()


@pytest.fixture
def scripted_model():
    """The scripted model server on a free port; give it a script with `.script({...})`."""
    server = ScriptedModelFixture(server_start())
    yield server
    server.stop()
