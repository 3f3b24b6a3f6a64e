"""What the saver stores is what it was given: random histories of checkpoints whose list
channels grow by appends, are replaced, shrink and are emptied, beside other values, across
namespaces and forks, read back exactly by `get_tuple` and `list`; and an append is stored as
the appended suffix on the parent's version, anything else whole."""

import copy
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

from django.db import connection
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langgraph.checkpoint.base import Checkpoint
from langgraph.checkpoint.base.id import uuid6

from agentplatform.langgraph import PlatformSaver

CHANNELS = ("messages", "notes", "state")
NAMESPACES = ("", "child:1")

items = st.one_of(st.integers(-1000, 1000), st.text(max_size=6),
                  st.dictionaries(st.text(max_size=3), st.integers(0, 9), max_size=2))
lists = st.lists(items, max_size=4)
others = st.one_of(st.none(), st.integers(-10**6, 10**6), st.text(max_size=10),
                   st.dictionaries(st.text(max_size=3), st.integers(-99, 99), max_size=2))
changes = st.one_of(
    st.tuples(st.just("append"), st.sampled_from(CHANNELS), lists),
    st.tuples(st.just("append"), st.sampled_from(CHANNELS), lists),
    st.tuples(st.just("replace"), st.sampled_from(CHANNELS), lists),
    st.tuples(st.just("shrink"), st.sampled_from(CHANNELS), st.integers(0, 4)),
    st.tuples(st.just("set"), st.sampled_from(CHANNELS), others),
    st.tuples(st.just("clear"), st.sampled_from(CHANNELS), st.none()),  # a version, no value
    st.tuples(st.just("touch"), st.sampled_from(CHANNELS), st.none()),  # a version, same value
)
steps = st.tuples(
    st.sampled_from(NAMESPACES),
    st.lists(changes, min_size=1, max_size=3),
    st.integers(0, 3),  # the parent: 0 the namespace's latest checkpoint, k the k-th before it
    st.booleans(),  # put by a saver that has just been made (it remembers nothing)
)


@dataclass
class Put:
    config: dict
    parent: "Put | None"
    values: dict
    versions: dict
    new_versions: dict


def changed(parent: Put | None, edits, saver) -> tuple[dict, dict, dict]:
    values = copy.deepcopy(parent.values) if parent else {}
    versions = dict(parent.versions) if parent else {}
    new_versions = {}
    for kind, channel, arg in edits:
        old = values.get(channel)
        if kind == "append":
            values[channel] = (old if isinstance(old, list) else []) + arg
        elif kind == "replace":
            values[channel] = list(arg)
        elif kind == "shrink":
            values[channel] = old[:arg] if isinstance(old, list) else []
        elif kind == "set":
            values[channel] = arg
        elif kind == "clear":
            values.pop(channel, None)
        elif kind == "touch" and channel not in values:
            continue
        versions[channel] = new_versions[channel] = saver.get_next_version(versions.get(channel),
                                                                           None)
    return values, versions, new_versions


def stored_as_suffix(put: Put, channel: str) -> str | None:
    """The version the blob of `channel` at `put` must be stored on: its parent's, when the
    parent held a list there that the new list extends."""
    parent, value = put.parent, put.values.get(channel)
    if parent is None or type(value) is not list or channel not in parent.values:
        return None
    base = parent.values[channel]
    if type(base) is not list or value[:len(base)] != base:
        return None
    return parent.versions[channel]


def blob_rows(thread_id: str) -> dict[tuple[str, str, str], str | None]:
    with connection.cursor() as cursor:
        cursor.execute('SELECT checkpoint_ns, channel, version, base_version FROM "acme".graphs_blob '
                       "WHERE thread_id = %s", [thread_id])
        return {(ns, channel, version): base for ns, channel, version, base in cursor.fetchall()}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(history=st.lists(steps, min_size=1, max_size=25))
def test_every_checkpoint_reads_back_exactly_and_appends_are_stored_as_suffixes(history):
    thread_id = uuid.uuid4().hex
    saver = PlatformSaver(schema="acme")
    puts: dict[str, list[Put]] = {ns: [] for ns in NAMESPACES}
    for ns, edits, back, fresh in history:
        earlier = puts[ns]
        parent = earlier[-1 - min(back, len(earlier) - 1)] if earlier else None
        values, versions, new_versions = changed(parent, edits, saver)
        checkpoint = Checkpoint(v=4, id=str(uuid6(clock_seq=-1)), ts=datetime.now(UTC).isoformat(),
                                channel_values=copy.deepcopy(values), channel_versions=dict(versions),
                                versions_seen={}, updated_channels=sorted(new_versions))
        config = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns}}
        if parent:
            config["configurable"]["checkpoint_id"] = parent.config["configurable"]["checkpoint_id"]
        if fresh:
            saver = PlatformSaver(schema="acme")
        stored = saver.put(config, checkpoint, {"source": "loop", "step": len(earlier)},
                           dict(new_versions))
        for value in checkpoint["channel_values"].values():  # the caller's lists are its own
            if isinstance(value, list):
                value.append("changed after put")
        earlier.append(Put(stored, parent, values, versions, new_versions))

    reader = PlatformSaver(schema="acme")
    for ns, written in puts.items():
        for put in written:
            found = reader.get_tuple(put.config)
            assert found.checkpoint["channel_values"] == put.values
            assert found.checkpoint["channel_versions"] == put.versions
            assert found.parent_config == (put.parent.config if put.parent else None)
            # the writer serves the lists it remembers: what was stored, not the caller's lists
            values = saver.get_tuple(put.config).checkpoint["channel_values"]
            assert values == put.values
            for value in values.values():  # and what it hands out is the caller's own
                if isinstance(value, list):
                    value.append("changed after get_tuple")
        listed = list(reader.list({"configurable": {"thread_id": thread_id, "checkpoint_ns": ns}}))
        assert [t.config for t in listed] == [put.config for put in reversed(written)]
        assert [t.checkpoint["channel_values"] for t in listed] == [p.values for p in reversed(written)]
        if written:
            latest = reader.get_tuple({"configurable": {"thread_id": thread_id, "checkpoint_ns": ns}})
            assert latest.checkpoint["channel_values"] == written[-1].values

    expected = {(ns, channel, str(version)): stored_as_suffix(put, channel)
                for ns, written in puts.items() for put in written
                for channel, version in put.new_versions.items() if channel in put.values}
    assert blob_rows(thread_id) == expected


def test_a_long_append_only_history_stores_each_item_once_and_reads_back_whole():
    thread_id, saver = uuid.uuid4().hex, PlatformSaver(schema="acme")
    messages, version, config = [], None, {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
    for n in range(300):
        messages = [*messages, {"n": n, "text": "x" * 100}]
        version = saver.get_next_version(version, None)
        checkpoint = Checkpoint(v=4, id=str(uuid6(clock_seq=-1)), ts=datetime.now(UTC).isoformat(),
                                channel_values={"messages": messages},
                                channel_versions={"messages": version}, versions_seen={},
                                updated_channels=["messages"])
        config = saver.put(config, checkpoint, {"source": "loop", "step": n}, {"messages": version})

    assert PlatformSaver(schema="acme").get_tuple(config).checkpoint["channel_values"] == {
        "messages": messages}
    with connection.cursor() as cursor:
        cursor.execute('SELECT count(*), count(base_version), sum(octet_length(blob)) '
                       'FROM "acme".graphs_blob WHERE thread_id = %s', [thread_id])
        rows, suffixes, stored_bytes = cursor.fetchone()
    assert (rows, suffixes) == (300, 299)
    assert stored_bytes < 300 * 130  # each ~115-byte message once, not 300 × 150 on average
