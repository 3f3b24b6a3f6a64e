"""A thread's latest checkpoint is the one written last, by the database's clock: checkpoint
ids come from each writer's wall clock, and a worker whose clock is behind the last writer's
must not put its checkpoint under its parent."""

import uuid
from datetime import UTC, datetime, timedelta

from langgraph.checkpoint.base import Checkpoint

from agentplatform.langgraph import PlatformSaver


def checkpoint(at: datetime, messages: list) -> Checkpoint:
    """A checkpoint whose id a writer with its clock at `at` would make (uuid6 is time-based)."""
    return Checkpoint(v=4, id=_uuid6_at(int(at.timestamp() * 1e9)), ts=at.isoformat(),
                      channel_values={"messages": messages}, channel_versions={},
                      versions_seen={}, updated_channels=["messages"])


def _uuid6_at(nanoseconds: int) -> str:
    """A uuid6 for a given time: its 60-bit timestamp is 100 ns intervals since 1582."""
    ticks = nanoseconds // 100 + 0x01B21DD213814000
    high, mid, low = ticks >> 28, (ticks >> 12) & 0xFFFF, ticks & 0x0FFF
    value = (high << 96) | (mid << 80) | (0x6 << 76) | (low << 64) | (0x8 << 60) \
        | (uuid.uuid4().int & ((1 << 62) - 1))
    return str(uuid.UUID(int=value))


def test_the_latest_is_the_last_written_even_from_a_clock_behind(in_acme):
    saver = PlatformSaver()
    config = {"configurable": {"thread_id": f"t-{uuid.uuid4().hex}", "checkpoint_ns": ""}}
    now = datetime.now(UTC)
    first = checkpoint(now, ["a"])
    version = saver.get_next_version(None, None)
    first["channel_versions"] = {"messages": version}
    parent = saver.put(config, first, {"source": "loop", "step": 1}, {"messages": version})
    behind = checkpoint(now - timedelta(seconds=3), ["a", "b"])  # another host, 3 s slow
    assert behind["id"] < first["id"]
    version = saver.get_next_version(version, None)
    behind["channel_versions"] = {"messages": version}
    saver.put(parent, behind, {"source": "loop", "step": 2}, {"messages": version})

    latest = saver.get_tuple(config)
    assert latest.checkpoint["id"] == behind["id"] and latest.metadata["step"] == 2
    assert latest.checkpoint["channel_values"]["messages"] == ["a", "b"]
    assert latest.parent_config["configurable"]["checkpoint_id"] == first["id"]
    # listing keeps LangGraph's order (by id, newest first), as its `before` filter needs
    assert [t.checkpoint["id"] for t in saver.list(config)] == [first["id"], behind["id"]]
