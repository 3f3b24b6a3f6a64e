"""Pytest fixtures for the fakes. Use from a conftest: `from tests.support.fakes.fixtures import *`."""

import pytest

from integrations.scripted_model import server_start

from .anthropic import FakeAnthropic
from .mcp_process import McpServerProcess
from .openai import FakeOpenAI
from .scripted_model import ScriptedModelFixture
from .slack import FakeSlack
from .smtp import SMTPServer, free_port
from .stripe import FakeStripe
from .webhook import FakeWebhook

__all__ = ["fake_anthropic", "fake_openai", "fake_slack", "fake_stripe", "fake_webhook", "mcp_server",
           "mcp_server_process", "scripted_model", "smtp_server"]


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


@pytest.fixture(scope="session")
def mcp_server_process():
    """The local MCP server, one process for the session (it starts in about a second)."""
    server = McpServerProcess(free_port()).start()
    yield server
    server.stop()


@pytest.fixture
def mcp_server(mcp_server_process):
    """The session's MCP server with its counts and delay reset."""
    if mcp_server_process.process.poll() is not None:
        mcp_server_process.start()
    mcp_server_process.reset()
    return mcp_server_process


@pytest.fixture
def scripted_model():
    """The scripted model server on a free port; give it a script with `.script({...})`."""
    server = ScriptedModelFixture(server_start())
    yield server
    server.stop()
