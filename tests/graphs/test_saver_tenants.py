"""A saver stores in one tenant's schema: acme's and globex's savers with the same thread id see
only their own checkpoints, and no saver stores in the public schema."""

import uuid

import pytest
from django_tenants.utils import tenant_context
from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_metadata

from agentplatform.langgraph import AsyncPlatformSaver, PlatformSaver


def put(saver: PlatformSaver, thread_id: str, said: str) -> dict:
    version = saver.get_next_version(None, None)
    checkpoint = generate_checkpoint(channel_values={"said": said},
                                     channel_versions={"said": version})
    return saver.put({"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}, checkpoint,
                     generate_metadata(), {"said": version})


def test_two_tenants_with_the_same_thread_id_see_only_their_own_checkpoints(acme, globex):
    with tenant_context(acme):
        in_acme = PlatformSaver()  # the schema is the tenant's selected when it is made
    with tenant_context(globex):
        in_globex = PlatformSaver()
    assert (in_acme.schema, in_globex.schema) == ("acme", "globex")
    thread = uuid.uuid4().hex
    put(in_acme, thread, "acme's")
    put(in_globex, thread, "globex's")
    put(in_globex, thread, "globex's again")

    config = {"configurable": {"thread_id": thread}}
    assert in_acme.get_tuple(config).checkpoint["channel_values"] == {"said": "acme's"}
    assert [t.checkpoint["channel_values"]["said"] for t in in_globex.list(config)] == [
        "globex's again", "globex's"]
    assert len(list(in_acme.list(config))) == 1

    in_acme.delete_thread(thread)
    assert in_acme.get_tuple(config) is None
    assert in_globex.get_tuple(config).checkpoint["channel_values"] == {"said": "globex's again"}


def test_no_saver_is_made_for_the_public_schema():
    with pytest.raises(ValueError):
        PlatformSaver()  # no tenant selected
    with pytest.raises(ValueError):
        PlatformSaver(schema="public")
    with pytest.raises(ValueError):
        AsyncPlatformSaver()
