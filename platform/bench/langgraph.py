"""`python -m bench langgraph`: one LangGraph loop graph on PostgresSaver and on the platform's
saver (`agentplatform.langgraph`), and LangGraph's checkpointer conformance suite on ours.

The graph: a `StateGraph` whose state is `messages: Annotated[list, operator.add]` and a
counter; its one node appends one ~200-byte message per superstep and a conditional edge loops
back to it until the counter reaches N. Both savers run the same compiled graph with
LangGraph's default durability ("async"), each in a store of its own on the same server:

- PostgresSaver (`from_conn_string` + `setup()`) in a database of its own;
- PlatformSaver in a tenant schema made by `tenant_create` (its tables by the migrations).

Time is the wall time of `graph.invoke` over N supersteps, fresh thread per run, runs of the two
savers interleaved (their order alternating) and the median of `--repeat` taken. Bytes per step
are the growth of `pg_total_relation_size` (heap, indexes, TOAST) of the saver's tables over
the run, ÷ N. See docs/benchmarks.md.
"""

# Django is set up here, on the bench's own database, before the platform's imports below.
# ruff: noqa: E402

import os

import django
from django.apps import apps

OWN_DJANGO_SETUP = True  # picks agentplatform_bench_langgraph, so `bench checkpoints` can run too
DATABASE = "agentplatform_bench_langgraph"
if not apps.ready:  # under pytest the test settings are already set up and are kept
    os.environ.setdefault("BENCH_DATABASE_URL", f"postgres://postgres@127.0.0.1:5432/{DATABASE}")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
    django.setup()

import argparse
import asyncio
import contextlib
import operator
import statistics
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from importlib import metadata
from typing import Annotated, Any, TextIO, TypedDict

import psycopg
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connection, connections
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import Capability
from langgraph.checkpoint.conformance.report import CapabilityReport
from langgraph.checkpoint.conformance.spec.test_copy_thread import ALL_COPY_THREAD_TESTS
from langgraph.checkpoint.conformance.spec.test_delete_for_runs import ALL_DELETE_FOR_RUNS_TESTS
from langgraph.checkpoint.conformance.spec.test_delete_thread import ALL_DELETE_THREAD_TESTS
from langgraph.checkpoint.conformance.spec.test_get_tuple import ALL_GET_TUPLE_TESTS
from langgraph.checkpoint.conformance.spec.test_list import ALL_LIST_TESTS
from langgraph.checkpoint.conformance.spec.test_prune import ALL_PRUNE_TESTS
from langgraph.checkpoint.conformance.spec.test_put import ALL_PUT_TESTS
from langgraph.checkpoint.conformance.spec.test_put_writes import ALL_PUT_WRITES_TESTS
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.graph import END, START, StateGraph

from agentplatform.langgraph import AsyncPlatformSaver, PlatformSaver
from bench.checkpoints import message, relation_bytes, server_checkpoint
from bench.database import bench_database_prepare, database_drop, database_recreate, server_dsn
from tenants.services import tenant_create

LENGTHS = (100, 400, 1600)
QUICK_LENGTHS = (20, 40, 80)  # fewer steps may fit in pages already there: no growth to divide by
DURABILITY = "async"  # LangGraph's default: what `graph.invoke(...)` does when not told
PACKAGES = ("langgraph", "langgraph-checkpoint", "langgraph-checkpoint-postgres",
            "langgraph-checkpoint-conformance")
POSTGRES_TABLES = ("checkpoints", "checkpoint_blobs", "checkpoint_writes")
PLATFORM_TABLE_PREFIX = "graphs_"  # every table of runs/graphs in the tenant schema
# Each capability's tests, so that a capability the saver does not have counts as failed.
CONFORMANCE_TESTS = {
    Capability.PUT: len(ALL_PUT_TESTS), Capability.PUT_WRITES: len(ALL_PUT_WRITES_TESTS),
    Capability.GET_TUPLE: len(ALL_GET_TUPLE_TESTS), Capability.LIST: len(ALL_LIST_TESTS),
    Capability.DELETE_THREAD: len(ALL_DELETE_THREAD_TESTS),
    Capability.DELETE_FOR_RUNS: len(ALL_DELETE_FOR_RUNS_TESTS),
    Capability.COPY_THREAD: len(ALL_COPY_THREAD_TESTS), Capability.PRUNE: len(ALL_PRUNE_TESTS),
}


# -- the graph ------------------------------------------------------------------------------------
class LoopState(TypedDict):
    messages: Annotated[list, operator.add]
    count: int
    steps: int


def talk(state: LoopState) -> dict:
    count = state["count"] + 1
    return {"messages": [message(count)], "count": count}


def route(state: LoopState) -> str:
    return "talk" if state["count"] < state["steps"] else END


def loop_graph(checkpointer: BaseCheckpointSaver):
    """The benchmark's graph, compiled on `checkpointer`: one superstep per message."""
    builder = StateGraph(LoopState)
    builder.add_node("talk", talk)
    builder.add_edge(START, "talk")
    builder.add_conditional_edges("talk", route, ["talk", END])
    return builder.compile(checkpointer=checkpointer)


# -- the savers under test ------------------------------------------------------------------------
class Contender:
    """One saver running the loop graph; `disk_bytes()` sizes its tables from a connection of
    the bench's own (never the saver's)."""

    name = ""

    def __init__(self, dsn: str, schema: str):
        self.dsn, self.schema = dsn, schema
        self.stack = contextlib.ExitStack()
        self.graph = None

    def checkpointer(self) -> BaseCheckpointSaver:
        raise NotImplementedError

    def tables(self) -> list[str] | None:
        raise NotImplementedError

    def open(self) -> None:
        self.sizer = self.stack.enter_context(psycopg.connect(self.dsn, autocommit=True))
        self.graph = loop_graph(self.checkpointer())

    def run(self, steps: int) -> float:
        """Run the graph for `steps` supersteps on a fresh thread; the seconds invoke took."""
        config = {"configurable": {"thread_id": uuid.uuid4().hex}, "recursion_limit": steps + 10}
        started = time.perf_counter()
        result = self.graph.invoke({"messages": [], "count": 0, "steps": steps}, config)
        seconds = time.perf_counter() - started
        stored = self.graph.get_state(config).values  # read back: what the saver kept
        if result["count"] != steps or len(stored["messages"]) != steps or stored["count"] != steps:
            raise RuntimeError(f"{self.name}: {result['count']} steps run, {stored.get('count')} "
                               f"stored with {len(stored.get('messages', []))} messages, not {steps}")
        return seconds

    def disk_bytes(self) -> int:
        return relation_bytes(lambda sql, params: self.sizer.execute(sql, params).fetchone()[0],
                              self.schema, self.tables())

    def close(self) -> None:
        self.stack.close()


class PostgresSaverLoop(Contender):
    """LangGraph's PostgresSaver, as its docs set it up, on a schema of its own."""

    name = "PostgresSaver"

    def checkpointer(self) -> BaseCheckpointSaver:
        self.sizer.execute(f'CREATE SCHEMA IF NOT EXISTS "{self.schema}"')
        saver = self.stack.enter_context(PostgresSaver.from_conn_string(
            f"{self.dsn} options='-c search_path={self.schema}'"))
        saver.setup()
        return saver

    def tables(self) -> list[str]:
        return list(POSTGRES_TABLES)


class PlatformSaverLoop(Contender):
    """The platform's saver on Django's connection, in a tenant schema that already exists."""

    name = "PlatformSaver"

    def checkpointer(self) -> BaseCheckpointSaver:
        return PlatformSaver(schema=self.schema)

    def tables(self) -> list[str]:
        return [name for (name,) in self.sizer.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = %s AND starts_with(tablename, %s)",
            [self.schema, PLATFORM_TABLE_PREFIX]).fetchall()]


@dataclass(frozen=True)
class Measurement:
    saver: str
    steps: int
    seconds: float
    disk_bytes: int


@dataclass
class Cell:
    """Every measured run of one saver at one length; the medians are what is reported."""

    saver: str
    steps: int
    runs: list[Measurement] = field(default_factory=list)

    @property
    def steps_per_second(self) -> float:
        return statistics.median(self.steps / m.seconds for m in self.runs)

    @property
    def ms_per_step(self) -> float:
        return statistics.median(1000 * m.seconds / self.steps for m in self.runs)

    @property
    def bytes_per_step(self) -> float:
        return statistics.median(m.disk_bytes / self.steps for m in self.runs)

    @property
    def spread(self) -> float:
        """(slowest − fastest) ÷ median run time: how much the machine moved under this cell."""
        seconds = [m.seconds for m in self.runs]
        return (max(seconds) - min(seconds)) / statistics.median(seconds)


def measure(contender: Contender, steps: int) -> Measurement:
    server_checkpoint()  # no run pays for flushing the previous run's dirty pages
    before = contender.disk_bytes()
    seconds = contender.run(steps)
    return Measurement(contender.name, steps, seconds, contender.disk_bytes() - before)


def throughput_measure(*, contenders: list[Contender], lengths: Iterable[int], repeat: int,
                       warmup: int) -> dict[tuple[str, int], Cell]:
    """Each length in turn; within it `repeat` rounds of one run per saver, the order of the
    savers alternating between rounds so that neither always runs second."""
    cells: dict[tuple[str, int], Cell] = {}
    for contender in contenders:
        contender.open()
        if warmup:
            contender.run(warmup)
    for steps in sorted(lengths):
        for round_ in range(repeat):
            for contender in contenders if round_ % 2 == 0 else contenders[::-1]:
                m = measure(contender, steps)
                cells.setdefault((contender.name, steps), Cell(contender.name, steps)).runs.append(m)
                print(f"  {contender.name} {steps} steps, round {round_ + 1}: "
                      f"{steps / m.seconds:.0f} steps/s, {m.disk_bytes / steps:.0f} B/step",
                      file=sys.stderr, flush=True)
    return cells


# -- conformance ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Conformance:
    """Passed and total tests per capability of one saver; a capability the saver lacks counts
    every one of its tests as failed."""

    saver: str
    capabilities: dict[str, tuple[int, int]]
    error: str = ""
    failures: tuple[str, ...] = ()

    @property
    def passed(self) -> int:
        return sum(passed for passed, _ in self.capabilities.values())

    @property
    def total(self) -> int:
        return sum(total for _, total in self.capabilities.values())


def conformance_count(saver: str, report: CapabilityReport | None, error: str = "") -> Conformance:
    capabilities, failures = {}, []
    for capability, tests in CONFORMANCE_TESTS.items():
        result = report.results.get(capability.value) if report is not None else None
        if result is None or not result.detected:
            capabilities[capability.value] = (0, tests)
        else:
            capabilities[capability.value] = (result.tests_passed,
                                              result.tests_passed + result.tests_failed)
            failures += [f"{capability.value}: {failure.strip().splitlines()[0][:200]}"
                         for failure in result.failures]
    return Conformance(saver, capabilities, error, tuple(failures))


async def conformance_validate(name: str,
                               factory: Callable[[], AsyncIterator[BaseCheckpointSaver]]) -> Conformance:
    """LangGraph's conformance suite, every capability, a fresh saver from `factory` for each."""
    try:
        report = await validate(checkpointer_test(name=name)(factory))
    except Exception as exc:  # the saver could not even be made: every test failed
        return conformance_count(name, None, f"{type(exc).__name__}: {exc}".splitlines()[0][:300])
    return conformance_count(name, report)


class SyncSaverInThread(BaseCheckpointSaver):
    """A sync saver seen through LangGraph's async interface, for the conformance suite: every
    call runs in asgiref's one thread-sensitive thread (Django's connection is per thread and
    refuses to be used inside an event loop). Only the methods the sync saver has are adapted
    (see `sync_saver_in_thread`), so the suite detects the same capabilities."""

    def __init__(self, saver: BaseCheckpointSaver):
        super().__init__(serde=saver.serde)
        self.saver = saver

    def get_next_version(self, current, channel):
        return self.saver.get_next_version(current, channel)

    async def aget_tuple(self, config):
        return await sync_to_async(self.saver.get_tuple)(config)

    async def alist(self, config, *, filter=None, before=None, limit=None):
        found = await sync_to_async(lambda: list(self.saver.list(
            config, filter=filter, before=before, limit=limit)))()
        for item in found:
            yield item

    async def aput(self, config, checkpoint, metadata, new_versions):
        return await sync_to_async(self.saver.put)(config, checkpoint, metadata, new_versions)

    async def aput_writes(self, config, writes, task_id, task_path=""):
        return await sync_to_async(self.saver.put_writes)(config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id):
        return await sync_to_async(self.saver.delete_thread)(thread_id)

    async def adelete_for_runs(self, run_ids):
        return await sync_to_async(self.saver.delete_for_runs)(run_ids)

    async def acopy_thread(self, source_thread_id, target_thread_id):
        return await sync_to_async(self.saver.copy_thread)(source_thread_id, target_thread_id)

    async def aprune(self, thread_ids, *, strategy="keep_latest"):
        return await sync_to_async(self.saver.prune)(thread_ids, strategy=strategy)


ADAPTED = {"aget_tuple": "get_tuple", "alist": "list", "aput": "put", "aput_writes": "put_writes",
           "adelete_thread": "delete_thread", "adelete_for_runs": "delete_for_runs",
           "acopy_thread": "copy_thread", "aprune": "prune"}


def sync_saver_in_thread(saver: BaseCheckpointSaver) -> BaseCheckpointSaver:
    """`SyncSaverInThread` without the async methods whose sync method `saver` does not have
    (still BaseCheckpointSaver's), so the suite does not count what is not there."""
    missing = {name: getattr(BaseCheckpointSaver, name) for name, sync_name in ADAPTED.items()
               if getattr(type(saver), sync_name) is getattr(BaseCheckpointSaver, sync_name)}
    adapter = type(f"{type(saver).__name__}InThread", (SyncSaverInThread,), missing)
    return adapter(saver)


def conformance_run(*, schema: str, postgres_dsn: str, postgres_schema: str) -> list[Conformance]:
    """The suite on AsyncPlatformSaver, on PlatformSaver (through `sync_saver_in_thread`) and,
    as a check of the suite itself, on AsyncPostgresSaver."""

    async def platform_async() -> AsyncIterator[BaseCheckpointSaver]:
        async with AsyncPlatformSaver.from_settings(schema=schema) as saver:
            yield saver

    async def platform_sync() -> AsyncIterator[BaseCheckpointSaver]:
        saver = await sync_to_async(PlatformSaver)(schema=schema)
        try:
            yield sync_saver_in_thread(saver)
        finally:
            await sync_to_async(connections.close_all)()  # that thread's own connection

    async def postgres() -> AsyncIterator[BaseCheckpointSaver]:
        async with AsyncPostgresSaver.from_conn_string(
                f"{postgres_dsn} options='-c search_path={postgres_schema}'") as saver:
            yield saver

    async def all_three() -> list[Conformance]:
        return [await conformance_validate("AsyncPlatformSaver", platform_async),
                await conformance_validate("PlatformSaver", platform_sync),
                await conformance_validate("AsyncPostgresSaver", postgres)]

    return asyncio.run(all_three())


# -- the benchmark --------------------------------------------------------------------------------
def langgraph_bench(*, schema: str, postgres_dsn: str, postgres_schema: str = "bench_postgressaver",
                    lengths: Iterable[int] = LENGTHS, repeat: int = 3, warmup: int = 20,
                    conformance: bool = True, out: TextIO = sys.stdout) -> dict[str, Any]:
    """Measure both savers at every length, run the conformance suite, print the table and the
    closing line. `schema` is an existing tenant schema (migrated), `postgres_dsn` a database
    where PostgresSaver gets `postgres_schema` to itself."""
    lengths = sorted(lengths)
    ours = PlatformSaverLoop(server_dsn(settings.DATABASES["default"]["NAME"]), schema)
    theirs = PostgresSaverLoop(postgres_dsn, postgres_schema)
    try:
        cells = throughput_measure(contenders=[theirs, ours], lengths=lengths, repeat=repeat,
                                   warmup=warmup)
    finally:
        theirs.close()
        ours.close()
    suites = (conformance_run(schema=schema, postgres_dsn=postgres_dsn,
                              postgres_schema=postgres_schema) if conformance else [])
    return report(cells=cells, lengths=lengths, suites=suites, repeat=repeat, out=out)


def _server_facts() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('server_version'), current_setting('synchronous_commit'),"
                       " current_setting('fsync')")
        version, sync_commit, fsync = cursor.fetchone()
    return f"PostgreSQL {version} (synchronous_commit={sync_commit}, fsync={fsync})"


def _versions() -> str:
    found = []
    for package in PACKAGES:
        try:
            found.append(f"{package} {metadata.version(package)}")
        except metadata.PackageNotFoundError:
            found.append(f"{package} not installed")
    return ", ".join(found)


def report(*, cells: dict[tuple[str, int], Cell], lengths: list[int], suites: list[Conformance],
           repeat: int, out: TextIO) -> dict[str, Any]:
    first, last = lengths[0], lengths[-1]
    print(f"langgraph: a loop graph appending one ~200-byte message per superstep, "
          f"durability={DURABILITY!r} (LangGraph's default); {_server_facts()}; "
          f"median of {repeat} interleaved run(s) per cell", file=out)
    print(f"  {_versions()}", file=out)
    header = (f"{'saver':<14} {'steps':>6} {'steps/s':>9} {'ms/step':>8} {'B/step disk':>12} "
              f"{'spread':>7}")
    print(header, file=out)
    print("-" * len(header), file=out)
    for name in (PostgresSaverLoop.name, PlatformSaverLoop.name):
        for steps in lengths:
            c = cells[(name, steps)]
            print(f"{name:<14} {steps:>6} {c.steps_per_second:>9.0f} {c.ms_per_step:>8.3f} "
                  f"{c.bytes_per_step:>12.0f} {100 * c.spread:>6.0f}%", file=out)

    def growth(name: str) -> float | None:
        small = cells[(name, first)].bytes_per_step
        return cells[(name, last)].bytes_per_step / small if small > 0 else None

    speed = (cells[(PlatformSaverLoop.name, last)].steps_per_second
             / cells[(PostgresSaverLoop.name, last)].steps_per_second)
    ours_growth, theirs_growth = growth(PlatformSaverLoop.name), growth(PostgresSaverLoop.name)
    counted = [suite for suite in suites if suite.saver != "AsyncPostgresSaver"]
    if suites:
        print("conformance (langgraph-checkpoint-conformance, every capability; a capability "
              "not implemented counts all its tests as failed):", file=out)
        for suite in suites:
            cells_ = " ".join(f"{cap}={p}/{t}" for cap, (p, t) in suite.capabilities.items())
            note = "" if suite in counted else "  (the suite's own check, not counted)"
            print(f"  {suite.saver:<19} {suite.passed:>3}/{suite.total:<3} {cells_}{note}", file=out)
            if suite.error:
                print(f"    error: {suite.error}", file=out)
            for failure in suite.failures:
                print(f"    failed: {failure}", file=out)
    passed, total = sum(s.passed for s in counted), sum(s.total for s in counted)

    def shown(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.2f}"

    print(f"at {last} steps PlatformSaver runs {speed:.2f}× PostgresSaver's steps/s; bytes/step "
          f"{last} ÷ {first}: PlatformSaver {shown(ours_growth)}, PostgresSaver "
          f"{shown(theirs_growth)}", file=out)
    shown_conformance = f"{passed}/{total}" if suites else "skipped"
    print(f"langgraph: conformance={shown_conformance} steps_per_s_vs_postgressaver={speed:.2f} "
          f"bytes_per_step_growth={shown(ours_growth)} postgressaver_growth={shown(theirs_growth)}",
          file=out, flush=True)
    return {"cells": cells, "suites": suites, "conformance": (passed, total), "speed": speed,
            "growth": ours_growth, "postgressaver_growth": theirs_growth}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench langgraph", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", default=",".join(map(str, LENGTHS)),
                        help="run lengths, comma-separated (default: %(default)s)")
    parser.add_argument("--quick", action="store_true",
                        help=f"smoke run: lengths {QUICK_LENGTHS}, one run per cell, 3 warm-up steps")
    parser.add_argument("--repeat", type=int, default=3,
                        help="interleaved rounds per length; the median counts")
    parser.add_argument("--warmup", type=int, default=20, help="steps of an unmeasured first run")
    parser.add_argument("--no-conformance", action="store_true", help="skip the conformance suite")
    parser.add_argument("--keep", action="store_true", help="keep the bench databases afterwards")
    args = parser.parse_args(argv)
    try:
        lengths = QUICK_LENGTHS if args.quick else tuple(int(s) for s in args.steps.split(","))
    except ValueError:
        parser.error("bad --steps")
    if min(lengths) < 1 or args.repeat < 1:
        parser.error("lengths and --repeat must be positive")

    database = settings.DATABASES["default"]["NAME"]
    postgres_database = f"{database}_pg"
    bench_database_prepare()
    database_recreate(postgres_database)
    try:
        tenant_create(schema_name="bench_langgraph")
        connection.set_schema_to_public()
        langgraph_bench(schema="bench_langgraph", postgres_dsn=server_dsn(postgres_database),
                        lengths=lengths, repeat=1 if args.quick else args.repeat,
                        warmup=3 if args.quick else args.warmup,
                        conformance=not args.no_conformance)
    finally:
        if not args.keep:
            connections.close_all()
            database_drop(postgres_database)
            database_drop(database)
    return 0
