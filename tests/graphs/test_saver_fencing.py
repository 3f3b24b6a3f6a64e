"""A saver fenced on a platform run's lease writes while the run's lease epoch is the one it was
given; once the epoch moves on (another worker took the run over), every write raises LeaseLost
and writes nothing."""

import asyncio
import uuid
from datetime import UTC, datetime

import pytest
from django.db import connection
from django.db.models import F
from langgraph.checkpoint.base import Checkpoint
from langgraph.checkpoint.base.id import uuid6

from agentplatform.langgraph import AsyncPlatformSaver, Fence, PlatformSaver
from runs.engine import LeaseLost
from runs.models import Run
from tests.support.runs import start


def checkpoint(messages: list) -> Checkpoint:
    return Checkpoint(v=4, id=str(uuid6(clock_seq=-1)), ts=datetime.now(UTC).isoformat(),
                      channel_values={"messages": messages}, channel_versions={}, versions_seen={},
                      updated_channels=["messages"])


def put(saver, config: dict, messages: list, run_id: str) -> dict:
    cp = checkpoint(messages)
    version = saver.get_next_version(None, None)
    cp["channel_versions"] = {"messages": version}
    return saver.put(config, cp, {"source": "loop", "step": 0, "run_id": run_id},
                     {"messages": version})


def stored(*thread_ids: str) -> tuple[int, int, int]:
    with connection.cursor() as cursor:
        return tuple(
            cursor.execute(f"SELECT count(*) FROM graphs_{table} WHERE thread_id = ANY(%s)",
                           [list(thread_ids)]).fetchone()[0]
            for table in ("checkpoint", "blob", "write"))


def test_a_fenced_saver_writes_under_its_epoch_and_nothing_once_the_run_is_taken_over(in_acme):
    run = start("chatter", input={"steps": 3})
    saver = PlatformSaver(fence=Fence(run.id, run.lease_epoch))
    thread, copy = uuid.uuid4().hex, uuid.uuid4().hex
    first = put(saver, {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}, ["hello"],
                str(run.id))
    saver.put_writes(first, [("messages", ["again"])], "task-1")
    second = put(saver, first, ["hello", "again"], str(run.id))
    saver.copy_thread(thread, copy)
    assert stored(thread) == (2, 2, 1) and stored(copy) == (2, 2, 1)

    Run.objects.filter(id=run.id).update(lease_epoch=F("lease_epoch") + 1)  # a successor's claim
    writes = {
        "put": lambda: put(saver, second, ["hello", "again", "late"], str(run.id)),
        "put_writes": lambda: saver.put_writes(second, [("messages", ["late"])], "task-2"),
        "delete_thread": lambda: saver.delete_thread(thread),
        "delete_for_runs": lambda: saver.delete_for_runs([str(run.id)]),
        "copy_thread": lambda: saver.copy_thread(thread, uuid.uuid4().hex),
        "prune keep_latest": lambda: saver.prune([thread, copy]),
        "prune delete": lambda: saver.prune([thread, copy], strategy="delete"),
    }
    for name, write in writes.items():
        with pytest.raises(LeaseLost):
            write()
        assert stored(thread) == (2, 2, 1) and stored(copy) == (2, 2, 1), name
    with connection.cursor() as cursor:
        assert cursor.execute("SELECT count(*) FROM graphs_checkpoint WHERE metadata ->> 'run_id' = %s",
                              [str(run.id)]).fetchone()[0] == 4

    successor = PlatformSaver(fence=Fence(run.id, run.lease_epoch + 1))
    successor.put_writes(second, [("messages", ["from the successor"])], "task-3")
    assert successor.get_tuple(second).pending_writes == [("task-3", "messages",
                                                           ["from the successor"])]


def test_a_fence_on_a_run_that_does_not_exist_writes_nothing(in_acme):
    saver = PlatformSaver(fence=Fence(uuid.uuid4(), 1))
    thread = uuid.uuid4().hex
    with pytest.raises(LeaseLost):
        put(saver, {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}, ["hello"], "r")
    assert stored(thread) == (0, 0, 0)


def test_the_async_saver_is_fenced_alike(in_acme):
    run = start("chatter", input={"steps": 3})
    thread = uuid.uuid4().hex

    async def writes(epoch: int) -> None:
        async with AsyncPlatformSaver.from_settings(schema="acme", fence=Fence(run.id, epoch)) as saver:
            cp = checkpoint(["hello"])
            await saver.aput({"configurable": {"thread_id": thread, "checkpoint_ns": ""}}, cp,
                             {"source": "loop", "step": 0}, {})

    asyncio.run(writes(run.lease_epoch))
    asyncio.run(writes(run.lease_epoch))
    with pytest.raises(LeaseLost):
        asyncio.run(writes(run.lease_epoch + 1))
    assert stored(thread)[0] == 2
