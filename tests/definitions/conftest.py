"""Tenant-defined agents against the scripted model server and the local fake receivers."""

import uuid

import pytest

from integrations.services import credential_set
from runs.definitions.services import definition_create
from tests.support.fakes.fixtures import fake_stripe, fake_webhook, scripted_model  # noqa: F401

MODEL = "scripted"


@pytest.fixture
def model(in_acme, scripted_model):  # noqa: F811
    """The tenant's model credential points at the scripted model server."""
    credential_set(connector="model", secrets={"api_key": "sk-scripted",
                                               "base_url": scripted_model.base_url})
    return scripted_model


@pytest.fixture
def webhook(in_acme, fake_webhook):  # noqa: F811
    credential_set(connector="webhook", secrets={"signing_secret": "whsec_test"})
    return fake_webhook


def define(name: str, *, tools: list[dict], limits: dict | None = None, **spec) -> str:
    """Store version 1 of a definition whose model is the scripted one, named after the agent;
    the name gets a suffix (the database outlives each test). Returns it: also the script's key."""
    name = f"{name}-{uuid.uuid4().hex[:8]}"
    definition_create(name=name, by="test", spec={
        "model": {"name": name}, "instructions": f"You are {name}.", "tools": tools,
        **({"limits": limits} if limits else {}), **spec})
    return name


# The model picks the url here (the parameters say so; the default is the credential's url).
POST = {"name": "post", "kind": "connector", "action": "webhook.post", "description": "Post a payload",
        "parameters": {"type": "object", "required": ["url", "payload"], "additionalProperties": False,
                       "properties": {"url": {"type": "string"}, "payload": {"type": "object"}}}}
