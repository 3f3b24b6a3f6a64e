"""LangGraph's checkpointer conformance suite (langgraph-checkpoint-conformance), every
capability including the optional ones, passes on the async saver and on the sync saver, each
in a tenant schema."""

import asyncio
from concurrent.futures import ThreadPoolExecutor

import psycopg
from django.conf import settings
from django.db import connections
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES

from agentplatform.langgraph import AsyncPlatformSaver, PlatformSaver
from bench.database import server_dsn


class PlatformSaverInThreads(PlatformSaver):
    """The sync saver seen through LangGraph's async interface (the suite is async only): each
    call runs the sync method in a thread of `executor`, as LangGraph's background threads do."""

    def __init__(self, *args, executor: ThreadPoolExecutor | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.executor = executor

    async def _in_thread(self, method, *args, **kwargs):
        return await asyncio.get_running_loop().run_in_executor(
            self.executor, lambda: method(*args, **kwargs))

    async def aget_tuple(self, config):
        return await self._in_thread(self.get_tuple, config)

    async def alist(self, config, *, filter=None, before=None, limit=None):
        found = await self._in_thread(lambda: list(self.list(config, filter=filter, before=before,
                                                              limit=limit)))
        for item in found:
            yield item

    async def aput(self, config, checkpoint, metadata, new_versions):
        return await self._in_thread(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(self, config, writes, task_id, task_path=""):
        return await self._in_thread(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id):
        return await self._in_thread(self.delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids):
        return await self._in_thread(self.delete_for_runs, run_ids)

    async def acopy_thread(self, source_thread_id, target_thread_id):
        return await self._in_thread(self.copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids, *, strategy="keep_latest"):
        return await self._in_thread(self.prune, thread_ids, strategy=strategy)


def passed_everything(registered) -> tuple[int, int]:
    report = asyncio.run(validate(registered))
    results = {name: report.results[name.value] for name in ALL_CAPABILITIES}
    failures = [f for result in results.values() for f in result.failures]
    assert not failures, failures
    assert all(result.detected and result.passed for result in results.values()), results
    passed = sum(result.tests_passed for result in results.values())
    assert passed > 0
    return passed, sum(result.tests_failed for result in results.values())


def test_async_saver_passes_every_capability_of_the_conformance_suite():
    @checkpointer_test(name="AsyncPlatformSaver")
    async def factory():
        async with AsyncPlatformSaver.from_settings(schema="acme") as saver:
            yield saver

    passed, failed = passed_everything(factory)
    assert failed == 0 and passed >= 80


def test_sync_saver_on_its_own_connection_passes_every_capability_from_many_threads():
    @checkpointer_test(name="PlatformSaver on a psycopg connection")
    async def factory():
        with psycopg.connect(server_dsn(settings.DATABASES["default"]["NAME"]),
                             autocommit=True) as conn:
            yield PlatformSaverInThreads(conn, schema="acme")

    passed, failed = passed_everything(factory)
    assert failed == 0 and passed >= 80


def test_sync_saver_on_djangos_connection_passes_every_capability_from_another_thread():
    executor = ThreadPoolExecutor(max_workers=1)  # one thread: one Django connection to close

    @checkpointer_test(name="PlatformSaver on Django's connection")
    async def factory():
        yield PlatformSaverInThreads(schema="acme", executor=executor)

    try:
        passed, failed = passed_everything(factory)
    finally:
        executor.submit(connections.close_all).result()
        executor.shutdown()
    assert failed == 0 and passed >= 80
