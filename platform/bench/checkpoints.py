"""Checkpoint cost: steps/s and bytes stored per step of a loop agent whose every step appends
one ~200-byte message of random text to an append-only history, on the same PostgreSQL server:

- ours: `runs.engine.advance` in-process, `sync` durability, in a tenant schema of its own;
- langgraph: a `StateGraph` with a `messages` list reducer, `PostgresSaver`, durability "sync";
- dbos: a workflow with one `@DBOS.step` per iteration, on a system database of its own;
- floor: one single-row INSERT + COMMIT per step on one psycopg connection.

Every system is measured the same way: wall time of the whole run (start to result), bytes of
the rows the run left (sum of `pg_column_size(row)`), and the growth of its tables on disk
(`pg_total_relation_size` after minus before: heap, indexes and TOAST). See docs/benchmarks.md.
"""

import argparse
import json
import operator
import random
import string
import sys
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import metadata
from typing import Annotated, Any, TextIO, TypedDict

import psycopg
from django.conf import settings
from django.db import connection, transaction

from runs.agents import Agent
from runs.transitions import finish, goto

LENGTHS = (100, 400, 1600)
QUICK_LENGTHS = (20, 80, 320)
SYSTEMS = ("ours", "langgraph", "dbos", "floor")
PEER_PACKAGES = {"langgraph": ("langgraph", "langgraph-checkpoint-postgres"), "dbos": ("dbos",)}
TEXT_ALPHABET = string.ascii_letters + string.digits + " "
TEXT_CHARS = 185  # {"n": …, "text": …} is then ~200 bytes of JSON


def message(n: int) -> dict[str, Any]:
    """The n-th message of a run: random text, so that no system gets it compressed for free."""
    return {"n": n, "text": "".join(random.choices(TEXT_ALPHABET, k=TEXT_CHARS))}


# -- our side: the bench's own agent --------------------------------------------------------------
bench_loop = Agent("bench_loop", version=1, logs=["messages"],
                   description="checkpoints benchmark: one message appended per step")


@bench_loop.step(start=True, next=["talk"])
def talk(ctx, state):
    said = state["said"] + 1
    append = {"messages": [message(said)]}
    if said >= state["steps"]:
        return finish({"said": said}, update={"said": said}, append=append)
    return goto("talk", update={"said": said}, append=append)


# -- measuring ------------------------------------------------------------------------------------
class Unavailable(Exception):
    """A peer library that cannot be installed, imported or run here; the reason is printed."""


@dataclass(frozen=True)
class Measurement:
    system: str
    steps: int
    seconds: float
    row_bytes: int  # sum of pg_column_size over the rows this run left
    disk_bytes: int  # pg_total_relation_size of the system's tables, after minus before

    @property
    def steps_per_second(self) -> float:
        return self.steps / self.seconds

    @property
    def ms_per_step(self) -> float:
        return 1000 * self.seconds / self.steps

    @property
    def row_bytes_per_step(self) -> float:
        return self.row_bytes / self.steps

    @property
    def disk_bytes_per_step(self) -> float:
        return self.disk_bytes / self.steps


def relation_bytes(execute: Callable, schema: str, tables: Iterable[str] | None = None) -> int:
    """pg_total_relation_size (heap + indexes + TOAST) summed over `tables` of `schema`
    (all of its tables when `tables` is None)."""
    names = list(tables) if tables is not None else None
    return execute(
        "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relkind = 'r' AND (%s::text[] IS NULL OR c.relname = ANY(%s))",
        [schema, names, names],
    )


def row_bytes(execute: Callable, schema: str, columns: dict[str, str], key: Any) -> int:
    """Sum of pg_column_size(row) over the rows of each `table` whose `column` equals `key`."""
    total = 0
    for table, column in columns.items():
        total += execute(f'SELECT coalesce(sum(pg_column_size(t.*)), 0)::bigint '
                         f'FROM "{schema}"."{table}" t WHERE {column} = %s', [key])
    return total


def _scalar(conn: psycopg.Connection) -> Callable:
    return lambda sql, params: conn.execute(sql, params).fetchone()[0]


def _django_scalar(sql: str, params: list) -> Any:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone()[0]


class Contender:
    """One system under test: `run(steps)` returns (seconds, key of what the run stored)."""

    name = ""

    def open(self) -> None: ...

    def run(self, steps: int) -> tuple[float, Any]:
        raise NotImplementedError

    def row_bytes(self, key: Any) -> int:
        raise NotImplementedError

    def disk_bytes(self) -> int:
        raise NotImplementedError

    def close(self) -> None: ...


class Ours(Contender):
    """The engine core in-process (no Celery): run_start, then one advance() to the end."""

    name = "ours"
    TABLES = {"runs_run": "id", "runs_checkpoint": "run_id", "runs_logentry": "run_id",
              "runs_runevent": "run_id"}

    def __init__(self, schema: str = "bench_checkpoints"):
        self.schema = schema
        self.tenant = None

    def open(self) -> None:
        from tenants.services import tenant_create

        connection.set_schema_to_public()
        self.tenant = tenant_create(schema_name=self.schema).tenant

    def run(self, steps: int) -> tuple[float, Any]:
        from runs.engine import Outcome, advance
        from runs.models import Run
        from runs.services import run_start

        connection.set_tenant(self.tenant)
        try:
            started = time.perf_counter()
            run = run_start(agent=bench_loop.name, version=bench_loop.version,
                            input={"steps": steps, "said": 0}, durability=Run.Durability.SYNC,
                            max_steps=steps, enqueue=False).run
            outcome = advance(run_id=run.id, slice_seconds=24 * 3600)
            seconds = time.perf_counter() - started
            run.refresh_from_db()
        finally:
            connection.set_schema_to_public()
        if outcome != Outcome.ENDED or run.status != Run.Status.SUCCEEDED or run.steps_taken != steps:
            raise RuntimeError(f"ours: run ended {outcome}/{run.status} after {run.steps_taken} "
                               f"steps: {run.error}")
        return seconds, run.id

    def row_bytes(self, key: Any) -> int:
        return row_bytes(_django_scalar, self.schema, self.TABLES, key)

    def disk_bytes(self) -> int:
        return relation_bytes(_django_scalar, self.schema, self.TABLES)

    def close(self) -> None:
        # Its schema and public rows only: this bench writes nothing to S3 (no retention pass,
        # no sandbox) and runs without one, where `tenant_delete` would stop at listing objects.
        if self.tenant is not None:
            connection.set_schema_to_public()
            with transaction.atomic():
                self.tenant.delete(force_drop=True)
            self.tenant = None


class Floor(Contender):
    """What one durable write per step costs at least: INSERT + COMMIT on one connection."""

    name = "floor"
    SCHEMA = "bench_floor"

    def __init__(self, dsn: str):
        self.dsn = dsn
        self.runs = 0

    def open(self) -> None:
        # autocommit: each INSERT is its own transaction, committed (and flushed) on return.
        self.conn = psycopg.connect(self.dsn, autocommit=True)
        self.conn.execute(f"DROP SCHEMA IF EXISTS {self.SCHEMA} CASCADE")
        self.conn.execute(f"CREATE SCHEMA {self.SCHEMA}")
        self.conn.execute(f"CREATE TABLE {self.SCHEMA}.message (id bigint GENERATED ALWAYS AS "
                          "IDENTITY PRIMARY KEY, run integer NOT NULL, body text NOT NULL)")

    def run(self, steps: int) -> tuple[float, Any]:
        self.runs += 1
        run, insert = self.runs, f"INSERT INTO {self.SCHEMA}.message (run, body) VALUES (%s, %s)"
        started = time.perf_counter()
        for n in range(1, steps + 1):
            self.conn.execute(insert, [run, json.dumps(message(n))])
        return time.perf_counter() - started, run

    def row_bytes(self, key: Any) -> int:
        return row_bytes(_scalar(self.conn), self.SCHEMA, {"message": "run"}, key)

    def disk_bytes(self) -> int:
        return relation_bytes(_scalar(self.conn), self.SCHEMA)

    def close(self) -> None:
        self.conn.execute(f"DROP SCHEMA IF EXISTS {self.SCHEMA} CASCADE")
        self.conn.close()


class LangGraphLoop(Contender):
    """A StateGraph whose one node appends a message and loops back to itself via a
    conditional edge; PostgresSaver in a schema of its own, durability "sync"."""

    name = "langgraph"
    SCHEMA = "bench_langgraph"
    TABLES = {"checkpoints": "thread_id", "checkpoint_blobs": "thread_id",
              "checkpoint_writes": "thread_id"}

    def __init__(self, dsn: str):
        self.dsn = dsn

    def open(self) -> None:
        try:
            from langgraph.checkpoint.postgres import PostgresSaver
            from langgraph.graph import END, START, StateGraph
            from psycopg.rows import dict_row
        except ImportError as exc:
            raise Unavailable(f"not installed ({exc}); pip install -e '.[bench]'") from None

        class LoopState(TypedDict):
            messages: Annotated[list, operator.add]
            steps: int

        def talk_node(state: LoopState) -> dict:
            return {"messages": [message(len(state["messages"]) + 1)]}

        def route(state: LoopState) -> str:
            return "talk" if len(state["messages"]) < state["steps"] else END

        with psycopg.connect(self.dsn, autocommit=True) as admin:
            admin.execute(f"DROP SCHEMA IF EXISTS {self.SCHEMA} CASCADE")
            admin.execute(f"CREATE SCHEMA {self.SCHEMA}")
        # The connection PostgresSaver.from_conn_string would open, on the bench's schema.
        self.conn = psycopg.connect(self.dsn, autocommit=True, prepare_threshold=0,
                                    row_factory=dict_row, options=f"-c search_path={self.SCHEMA}")
        saver = PostgresSaver(self.conn)
        saver.setup()
        builder = StateGraph(LoopState)
        builder.add_node("talk", talk_node)
        builder.add_edge(START, "talk")
        builder.add_conditional_edges("talk", route, ["talk", END])
        self.graph = builder.compile(checkpointer=saver)

    def run(self, steps: int) -> tuple[float, Any]:
        thread = uuid.uuid4().hex
        config = {"configurable": {"thread_id": thread}, "recursion_limit": steps + 10}
        started = time.perf_counter()
        result = self.graph.invoke({"messages": [], "steps": steps}, config, durability="sync")
        seconds = time.perf_counter() - started
        if len(result["messages"]) != steps:
            raise RuntimeError(f"langgraph: {len(result['messages'])} messages, not {steps}")
        return seconds, thread

    def _scalar(self, sql: str, params: list) -> Any:
        return next(iter(self.conn.execute(sql, params).fetchone().values()))

    def row_bytes(self, key: Any) -> int:
        return row_bytes(self._scalar, self.SCHEMA, self.TABLES, key)

    def disk_bytes(self) -> int:
        return relation_bytes(self._scalar, self.SCHEMA, self.TABLES)

    def close(self) -> None:
        self.conn.close()


class DbosLoop(Contender):
    """A DBOS workflow that calls one @DBOS.step per iteration; each step returns the message,
    which DBOS records as the step's output. DBOS gets a system database of its own."""

    name = "dbos"
    SCHEMA = "dbos"  # DBOS's default system schema

    def __init__(self, dbname: str, keep: bool = False):
        self.dbname, self.keep = dbname, keep
        self.conn: psycopg.Connection | None = None

    def open(self) -> None:
        try:
            from dbos import DBOS, SetWorkflowID
        except ImportError as exc:
            raise Unavailable(f"not installed ({exc}); pip install -e '.[bench]'") from None
        from .database import database_recreate, server_dsn, server_url

        database_recreate(self.dbname)

        @DBOS.step()
        def dbos_talk(n: int) -> dict:
            return message(n)

        @DBOS.workflow()
        def dbos_loop(steps: int) -> int:
            messages = []
            for n in range(1, steps + 1):
                messages.append(dbos_talk(n))
            return len(messages)

        self.workflow, self.set_workflow_id = dbos_loop, SetWorkflowID
        DBOS(config={"name": "agentplatform-bench", "system_database_url": server_url(self.dbname),
                     "log_level": "WARNING"})
        DBOS.launch()
        self.conn = psycopg.connect(server_dsn(self.dbname), autocommit=True)
        # Every system table that is keyed by workflow, as the workflow's rows are found.
        self.columns = {table: column for table, column in self.conn.execute(
            "SELECT table_name, column_name FROM information_schema.columns "
            "WHERE table_schema = %s AND column_name IN ('workflow_uuid', 'workflow_id') "
            "ORDER BY table_name", [self.SCHEMA]).fetchall()}

    def run(self, steps: int) -> tuple[float, Any]:
        workflow_id = uuid.uuid4().hex
        started = time.perf_counter()
        with self.set_workflow_id(workflow_id):
            count = self.workflow(steps)
        seconds = time.perf_counter() - started
        if count != steps:
            raise RuntimeError(f"dbos: {count} messages, not {steps}")
        return seconds, workflow_id

    def row_bytes(self, key: Any) -> int:
        return row_bytes(_scalar(self.conn), self.SCHEMA, self.columns, key)

    def disk_bytes(self) -> int:
        return relation_bytes(_scalar(self.conn), self.SCHEMA)

    def close(self) -> None:
        from .database import database_drop

        try:
            from dbos import DBOS
        except ImportError:
            return
        DBOS.destroy(destroy_registry=True)
        if self.conn is not None:
            self.conn.close()
        if not self.keep:
            database_drop(self.dbname)


# -- the benchmark --------------------------------------------------------------------------------
def server_checkpoint() -> None:
    """Start every measured run from clean buffers, so one run's dirty pages don't bill the next."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("CHECKPOINT")
    except Exception:  # no privilege for it (needs superuser or pg_checkpoint): measure without
        pass


def measure(contender: Contender, steps: int) -> Measurement:
    server_checkpoint()
    before = contender.disk_bytes()
    seconds, key = contender.run(steps)
    after = contender.disk_bytes()
    return Measurement(contender.name, steps, seconds, contender.row_bytes(key), after - before)


def _interleaved(ready: list[Contender], steps: int, repeat: int,
                 give_up: Callable[[Contender, Exception], None]):
    """Each contender's `repeat` runs at `steps`, sorted by time, measured in rounds: every
    round runs each contender once, the order rotating, so a spell of slow disk flushes (they
    come and go on this machine for seconds at a time) falls on all of them alike instead of
    on whichever ran its repeats back to back in it. A contender that fails is given up."""
    runs: dict[str, list[Measurement]] = {contender.name: [] for contender in ready}
    for round_ in range(repeat):
        for contender in ready[round_ % len(ready):] + ready[:round_ % len(ready)]:
            if contender not in ready:
                continue
            try:
                runs[contender.name].append(measure(contender, steps))
            except Exception as exc:
                give_up(contender, exc)
                ready.remove(contender)
    return [(contender, sorted(runs[contender.name], key=lambda m: m.seconds))
            for contender in ready]


def checkpoints_bench(*, contenders: list[Contender], lengths: Iterable[int], repeat: int = 5,
                      warmup: int = 20, out: TextIO = sys.stdout) -> dict[str, Any]:
    """Measure every contender at every length (median of `repeat` interleaved runs by time);
    print the table and the closing line. Peers that fail are reported, not fatal; ours and
    floor are."""
    lengths = sorted(lengths)
    unavailable: dict[str, str] = {}
    ready: list[Contender] = []
    results: dict[tuple[str, int], Measurement] = {}

    def give_up(contender: Contender, exc: Exception) -> None:
        if contender.name in ("ours", "floor"):
            raise exc
        unavailable[contender.name] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]

    try:
        for contender in contenders:
            try:
                contender.open()
                contender.run(warmup)
                ready.append(contender)
            except Exception as exc:
                give_up(contender, exc)
        for steps in lengths:
            for contender, runs in _interleaved(ready, steps, repeat, give_up):
                results[(contender.name, steps)] = runs[len(runs) // 2]
                print(f"  measured {contender.name} at {steps} steps: "
                      f"{results[(contender.name, steps)].ms_per_step:.3f} ms/step",
                      file=sys.stderr, flush=True)
    finally:
        for contender in contenders:
            try:
                contender.close()
            except Exception as exc:
                print(f"  closing {contender.name}: {exc}", file=sys.stderr)
    return report(contenders=contenders, lengths=lengths, results=results,
                  unavailable=unavailable, repeat=repeat, out=out)


def _server_facts() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('server_version'), current_setting('synchronous_commit'),"
                       " current_setting('fsync'), current_setting('full_page_writes')")
        version, sync_commit, fsync, fpw = cursor.fetchone()
    return (f"PostgreSQL {version} (synchronous_commit={sync_commit}, fsync={fsync}, "
            f"full_page_writes={fpw})")


def _versions(name: str) -> str:
    found = []
    for package in PEER_PACKAGES.get(name, ()):
        try:
            found.append(f"{package} {metadata.version(package)}")
        except metadata.PackageNotFoundError:
            found.append(f"{package} not installed")
    return ", ".join(found)


def report(*, contenders: list[Contender], lengths: list[int],
           results: dict[tuple[str, int], Measurement], unavailable: dict[str, str], repeat: int,
           out: TextIO) -> dict[str, Any]:
    middle, first, last = lengths[len(lengths) // 2], lengths[0], lengths[-1]
    print(f"checkpoints: a loop agent appending one ~200-byte message per step; "
          f"{_server_facts()}; median of {repeat} interleaved run(s) per cell", file=out)
    for contender in contenders:
        versions = _versions(contender.name)
        if versions:
            print(f"  {contender.name}: {versions}", file=out)
    header = (f"{'system':<10} {'steps':>6} {'steps/s':>9} {'ms/step':>8} "
              f"{'B/step rows':>12} {'B/step disk':>12}")
    print(header, file=out)
    print("-" * len(header), file=out)
    for contender in contenders:
        if contender.name in unavailable:
            print(f"{contender.name:<10} unavailable: {unavailable[contender.name]}", file=out)
            continue
        for steps in lengths:
            m = results.get((contender.name, steps))
            if m is not None:
                print(f"{m.system:<10} {steps:>6} {m.steps_per_second:>9.0f} {m.ms_per_step:>8.3f} "
                      f"{m.row_bytes_per_step:>12.0f} {m.disk_bytes_per_step:>12.0f}", file=out)

    def speed(name: str) -> float | None:
        m = results.get((name, middle))
        return m.steps_per_second if m is not None else None

    def growth(name: str, per_step: Callable[[Measurement], float]) -> float | None:
        small, large = results.get((name, first)), results.get((name, last))
        if small is None or large is None or per_step(small) <= 0:
            return None
        return per_step(large) / per_step(small)

    speeds = {name: speed(name) for name in SYSTEMS}
    ours = speeds["ours"]
    ratios = {name: (ours / speeds[name] if ours and speeds[name] else None)
              for name in ("langgraph", "dbos", "floor")}
    growths = {name: growth(name, lambda m: m.row_bytes_per_step) for name in SYSTEMS}
    disk_growth = growth("ours", lambda m: m.disk_bytes_per_step)
    summary = {"lengths": lengths, "speeds": speeds, "ratios": ratios, "growth": growths["ours"],
               "disk_growth": disk_growth, "unavailable": unavailable, "results": results}

    def shown(value: float | None, digits: int) -> str:
        return "n/a" if value is None else f"{value:.{digits}f}"

    print(f"bytes/step growth ({last} ÷ {first} steps, rows): "
          + " ".join(f"{name}={shown(g, 2)}" for name, g in growths.items() if name in
                     {c.name for c in contenders}) + f"; ours on disk={shown(disk_growth, 2)}",
          file=out)
    if ratios["floor"] is not None:
        print(f"ours at {middle} steps runs at {ratios['floor']:.2f}× the floor's steps/s "
              f"({1 / ratios['floor']:.2f}× its time per step)", file=out)

    def speed_field(name: str) -> str:
        if speeds[name] is not None:
            return f"{speeds[name]:.0f}"
        return "unavailable" if name in unavailable or name in {c.name for c in contenders} \
            else "skipped"

    print(f"checkpoints: ours={speed_field('ours')} langgraph={speed_field('langgraph')} "
          f"dbos={speed_field('dbos')} floor={speed_field('floor')} "
          f"vs_langgraph={shown(ratios['langgraph'], 1)} vs_dbos={shown(ratios['dbos'], 1)} "
          f"growth={shown(growths['ours'], 2)}", file=out, flush=True)
    return summary


def contenders_make(names: Iterable[str], *, dbos_database: str, keep: bool) -> list[Contender]:
    """The contenders in the order they are measured at each length (the floor first)."""
    from .database import server_dsn

    dsn = server_dsn(settings.DATABASES["default"]["NAME"])
    make = {"floor": lambda: Floor(dsn), "ours": Ours, "dbos": lambda: DbosLoop(dbos_database, keep),
            "langgraph": lambda: LangGraphLoop(dsn)}
    order = ("floor", "ours", "dbos", "langgraph")
    return [make[name]() for name in order if name in set(names)]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench checkpoints", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", default=",".join(map(str, LENGTHS)),
                        help="run lengths, comma-separated (default: %(default)s)")
    parser.add_argument("--quick", action="store_true",
                        help=f"smoke run: lengths {QUICK_LENGTHS}, one run per cell")
    parser.add_argument("--repeat", type=int, default=5,
                        help="runs per cell, interleaved across systems; the median counts")
    parser.add_argument("--warmup", type=int, default=20, help="steps of an unmeasured first run")
    parser.add_argument("--systems", default=",".join(SYSTEMS),
                        help="which to measure (default: %(default)s)")
    parser.add_argument("--keep", action="store_true", help="keep the bench databases afterwards")
    args = parser.parse_args(argv)
    lengths = QUICK_LENGTHS if args.quick else tuple(int(s) for s in args.steps.split(","))
    repeat = 1 if args.quick else args.repeat
    names = [name.strip() for name in args.systems.split(",") if name.strip()]
    unknown = set(names) - set(SYSTEMS)
    if unknown or len(lengths) < 1 or min(lengths) < 1:
        parser.error(f"unknown systems {sorted(unknown)}" if unknown else "bad --steps")

    from .database import bench_database_prepare, database_drop

    database = settings.DATABASES["default"]["NAME"]
    bench_database_prepare()
    try:
        checkpoints_bench(
            contenders=contenders_make(names, dbos_database=f"{database}_dbos", keep=args.keep),
            lengths=lengths, repeat=repeat, warmup=args.warmup,
        )
    finally:
        if not args.keep:
            from django.db import connections

            connections.close_all()
            database_drop(database)
    return 0
