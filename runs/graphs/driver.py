"""Graphs as agents: a LangGraph graph run by the platform, one superstep per step.

`Agent.from_langgraph(name, version, build)` calls `graph_agent_define`, which gives the agent
one step per graph node (all alike: the step is named for what runs next) and pins its runs to
the graph's topology. A step drives the graph one superstep further under the run's lease:

- the graph's checkpoints go to `PlatformSaver` in the tenant's schema, every write fenced on
  the lease epoch, so a worker that lost the run stops at its next write (LeaseLost);
- the graph's thread is the run (thread_id = run id); a step always continues from the
  thread's head, so a step re-run after a crash goes on where the graph really is;
- `interrupt(value)` in a node parks the run: an approval in the inbox (or, for
  `interrupt({"wait_for_event": {"kind": ..., "key": ...}})`, a wait on that event); the
  decision (or the event's payload) resumes the node with `Command(resume=...)`;
- `effect()` and `model()` in a node or `@task` go through the effect ledger, keyed on the
  LangGraph task's id: a task re-run after a crash gets the recorded result, never a second
  call. A `@task`'s result is kept as the task's pending write by the same fenced saver.
"""

import hashlib
import json
import threading
import time
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import asdict, dataclass, is_dataclass
from datetime import timedelta
from typing import Any
from uuid import UUID

import psycopg
from django.conf import settings
from django.db import DatabaseError, connection, transaction
from langgraph.config import get_config
from langgraph.graph import StateGraph
from langgraph.pregel import Pregel
from langgraph.types import Command, StateSnapshot

from ..agents import Agent
from ..engine import LeaseLost, StepContext, StepError
from ..models import Run
from ..transitions import Transition, finish, goto, wait_for_approval, wait_for_event
from .models import GraphBlob, GraphCheckpoint
from .saver import Fence, PlatformSaver

START = "__start__"
MARK = "langgraph"  # the state key that says where the graph's thread was after the step
ANSWERS = ("interrupt", "approval", "event", "timed_out")  # what one park leaves in the state
TITLE_MAX_CHARS = 200
TIMEOUT_MAX_SECONDS = 365 * 24 * 3600
FORK_DEPTH_MAX = 32  # forks of forks followed back to the thread a fork's state names
SAVER_IDLE_CHECK_SECONDS = 5.0  # a checkpoint connection idle this long is checked first
INT64 = (-(2**63), 2**64 - 1)  # what msgpack stores (unsigned up to 2**64 - 1)


def graph_agent_define(agent: Agent, build: Any) -> None:
    """Give `agent` one step per node of the graph `build` makes, and the graph's pins."""
    graph = graph_compiled(build)
    nodes = sorted(graph.nodes)
    step = _graph_step(graph)
    for node in nodes:
        agent.step(name=node, start=node == START, next=nodes)(step)
    agent.pins = {**(agent.pins or {}), "langgraph": graph_topology_hash(graph)}


def graph_compiled(build: Any) -> Pregel:
    """A compiled graph from a compiled graph, a StateGraph, or a function returning either."""
    if callable(build) and not isinstance(build, Pregel | StateGraph):
        build = build()
    if isinstance(build, StateGraph):
        build = build.compile()
    if not isinstance(build, Pregel):
        raise TypeError(f"Agent.from_langgraph takes a compiled graph, a StateGraph or a "
                        f"function returning one, not {type(build).__name__}")
    if START not in build.nodes:
        raise ValueError("the graph has no __start__ node: it was not built by a StateGraph")
    return build


def graph_topology_hash(graph: Pregel) -> str:
    """What a run's checkpoints depend on: nodes, edges (conditional ones with their declared
    ends) and channels. Code inside a node may change; a new shape is a new version."""
    drawn = graph.get_graph()
    branches = []
    builder = getattr(graph, "builder", None)
    for source, specs in sorted(getattr(builder, "branches", {}).items()):
        for name, spec in sorted(specs.items()):
            ends = spec.ends.values() if isinstance(spec.ends, dict) else spec.ends or ()
            branches.append([source, name, sorted(map(str, ends))])
    topology = {
        "nodes": sorted(graph.nodes),
        "edges": sorted([edge.source, edge.target, bool(edge.conditional)] for edge in drawn.edges),
        "branches": branches,
        "channels": sorted([name, type(channel).__name__]
                           for name, channel in graph.channels.items()),
    }
    canonical = json.dumps(topology, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


# -- the step ------------------------------------------------------------------------------

def _graph_step(graph: Pregel) -> Callable[[StepContext, Any], Transition]:
    def graph_superstep(ctx: StepContext, state) -> Transition:
        thread = str(ctx.run_id)
        try:
            saver = _saver_for(ctx)
            pregel = graph.copy(update={"checkpointer": saver})
            config = {"configurable": {"thread_id": thread}}
            mark = state.get(MARK)
            if _forked_from(mark, ctx.run_id):
                _fork_thread(ctx, source=mark["thread"], at=mark["checkpoint"])
            snapshot = pregel.get_state(config)
            if not snapshot.created_at:
                payload = graph_safe(ctx.input)
            elif (answer := _answer(state, snapshot)) is not None:
                payload = Command(resume={state["interrupt"]: graph_safe(answer)})
            elif snapshot.next or snapshot.interrupts:
                payload = None
            else:  # finished already (the worker died before the platform's checkpoint)
                return _transition(snapshot, thread)
            token = _running.set(_Running(ctx, threading.get_ident(), connection.schema_name))
            try:
                pregel.invoke(payload, config, interrupt_before="*", durability="sync")
            finally:
                _running.reset(token)
            return _transition(pregel.get_state(config), thread)
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            # The checkpoint connection, not the step, failed (a restart, a pooler's timeout):
            # as any database outage, the run is retried later, not the step failed.
            _saver_connections.conn = None
            raise DatabaseError(f"the graph's checkpoint connection failed: {exc}") from exc

    return graph_superstep


def _fork_thread(ctx: StepContext, *, source: str, at: str) -> None:
    """A fork's thread, made once: the source thread's checkpoint `at` and its ancestors, with
    every channel value, and no pending writes, so `at` is the head and the superstep after it
    runs again under the fork (with the same task ids however often the step is retried).
    Fenced on the fork's lease."""
    if GraphCheckpoint.objects.filter(thread_id=str(ctx.run_id)).exists():
        return
    table = {model: f"{connection.ops.quote_name(connection.schema_name)}."
                    f"{connection.ops.quote_name(model._meta.db_table)}"
             for model in (GraphCheckpoint, GraphBlob, Run)}
    checkpoints, blobs, runs = table[GraphCheckpoint], table[GraphBlob], table[Run]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"""
            WITH RECURSIVE fence AS (
                SELECT 1 FROM {runs} WHERE id = %(run)s AND lease_epoch = %(epoch)s FOR SHARE
            ), chain AS (
                SELECT checkpoint_id, parent_checkpoint_id FROM {checkpoints}
                 WHERE thread_id = %(source)s AND checkpoint_ns = '' AND checkpoint_id = %(at)s
                UNION ALL
                SELECT c.checkpoint_id, c.parent_checkpoint_id
                  FROM {checkpoints} c JOIN chain ON c.checkpoint_id = chain.parent_checkpoint_id
                 WHERE c.thread_id = %(source)s AND c.checkpoint_ns = ''
            ), copied AS (
                INSERT INTO {checkpoints} (thread_id, checkpoint_ns, checkpoint_id,
                       parent_checkpoint_id, type, checkpoint, channel_versions, metadata,
                       created_at)
                SELECT %(target)s, '', c.checkpoint_id, c.parent_checkpoint_id, c.type,
                       c.checkpoint, c.channel_versions, c.metadata, c.created_at
                  FROM {checkpoints} c, fence
                 WHERE c.thread_id = %(source)s AND c.checkpoint_ns = ''
                   AND c.checkpoint_id IN (SELECT checkpoint_id FROM chain)
             RETURNING checkpoint_id
            )
            INSERT INTO {blobs} (thread_id, checkpoint_ns, channel, version, type, blob,
                   base_version)
            SELECT %(target)s, b.checkpoint_ns, b.channel, b.version, b.type, b.blob,
                   b.base_version
              FROM {blobs} b
             WHERE b.thread_id = %(source)s AND b.checkpoint_ns = ''
               AND EXISTS (SELECT 1 FROM copied WHERE checkpoint_id = %(at)s)
            """, {"run": ctx.run_id, "epoch": ctx.epoch, "source": source, "at": at,
                  "target": str(ctx.run_id)})
    if GraphCheckpoint.objects.filter(thread_id=str(ctx.run_id), checkpoint_id=at).exists():
        return
    if not GraphCheckpoint.objects.filter(thread_id=source, checkpoint_id=at).exists():
        raise StepError(f"this run is a fork of a graph run whose thread {source} no longer has "
                        f"checkpoint {at}: it cannot go on from there")
    raise LeaseLost(f"run {ctx.run_id}: lease epoch {ctx.epoch} was taken over (fork not copied)")


def _forked_from(mark: Any, run_id: UUID) -> bool:
    """Whether `mark` (the graph's place, from the state) names a thread this run was forked
    from: its source, or the source's source... The state starts as the run's input, which
    a tenant writes: a mark naming any other thread is not followed (it would copy another
    run's thread, parked at an interrupt, and answer it)."""
    if not isinstance(mark, dict) or mark.get("thread") == str(run_id):
        return False
    source = Run.objects.filter(id=run_id).values_list("forked_from_id", flat=True).first()
    for _ in range(FORK_DEPTH_MAX):
        if source is None:
            return False
        if str(source) == mark.get("thread"):
            return isinstance(mark.get("checkpoint"), str)
        source = Run.objects.filter(id=source).values_list("forked_from_id", flat=True).first()
    return False


def _answer(state, snapshot: StateSnapshot) -> Any:
    """What the interrupt the run parked on was answered with; None if it was not answered
    (or was answered already: the thread moved on past it)."""
    pending = state.get("interrupt")
    if not pending or pending not in {interrupt.id for interrupt in snapshot.interrupts}:
        return None
    if timed_out := state.get("timed_out"):
        if timed_out.get("waiting_for") == "event":
            return {"timed_out": True}
        return {"approved": False, "timed_out": True}
    if (decision := state.get("approval")) is not None:
        return {key: decision.get(key) for key in ("approved", "by", "comment", "artifact")}
    if (event := state.get("event")) is not None:
        return event.get("payload")
    return None


def _transition(snapshot: StateSnapshot, thread: str) -> Transition:
    update = dict.fromkeys(ANSWERS) | {MARK: {
        "thread": thread, "checkpoint": snapshot.config["configurable"]["checkpoint_id"]}}
    if snapshot.interrupts:
        interrupt = snapshot.interrupts[0]
        node = _interrupted_node(snapshot, interrupt.id)
        update["interrupt"] = interrupt.id
        value = interrupt.value if isinstance(interrupt.value, dict) else {}
        timeout = _timeout(value)
        waits = {"then": node, "update": update, "timeout": timeout,
                 "on_timeout": node if timeout else None}
        if isinstance(value.get("wait_for_event"), dict):
            event = value["wait_for_event"]
            return wait_for_event(str(event.get("kind", "")), str(event.get("key", "")), **waits)
        return wait_for_approval(_request(node, interrupt.value), **waits)
    if not snapshot.next:
        return finish(_bounded(_jsonable(snapshot.values), "the graph's final state"),
                      update=update)
    return goto(snapshot.next[0], update=update)


def _interrupted_node(snapshot: StateSnapshot, interrupt_id: str) -> str:
    for task in snapshot.tasks:
        if any(interrupt.id == interrupt_id for interrupt in task.interrupts):
            return task.name
    return snapshot.next[0]


def _timeout(value: dict) -> timedelta | None:
    seconds = value.get("timeout_seconds")
    if isinstance(seconds, int | float) and not isinstance(seconds, bool) and seconds > 0:
        return timedelta(seconds=min(seconds, TIMEOUT_MAX_SECONDS))  # inf, 1e300: a year
    return None


def _request(node: str, value: Any) -> dict:
    """The approval an interrupt asks for: its `title` (else one naming the node), its
    `artifact` (else the whole value) and, when given, its `deciders`."""
    if not isinstance(value, dict):
        return {"title": f"{node} asks for a decision",
                "artifact": _bounded(_jsonable(value), "the interrupt's value")}
    title = value.get("title")
    request = {"title": str(title)[:TITLE_MAX_CHARS] if title else f"{node} asks for a decision",
               "artifact": _bounded(_jsonable(value.get("artifact", value)), "the artifact")}
    if isinstance(value.get("deciders"), list):
        request["deciders"] = [str(decider) for decider in value["deciders"]]
    return request


def _jsonable(value: Any) -> Any:
    """The graph's values as JSON (the run's result, an approval's artifact): pydantic models
    and dataclasses as their fields, anything else unknown as its text."""
    return json.loads(json.dumps(value, default=_json_default))


def _bounded(value: Any, what: str) -> Any:
    """`value`, or a note in its place if its JSON is over RUN_STATE_MAX_BYTES (the graph's
    thread keeps it whole)."""
    size = len(json.dumps(value))
    if size <= settings.RUN_STATE_MAX_BYTES:
        return value
    return {"omitted": f"{what} is {size} bytes as JSON, over RUN_STATE_MAX_BYTES "
                       f"({settings.RUN_STATE_MAX_BYTES}); the graph's thread holds it"}


def graph_safe(value: Any) -> Any:
    """A tenant's JSON (input, a decision, an event's payload) as LangGraph's serializer takes
    it: integers beyond 64 bits, which JSON allows and msgpack refuses, become their text."""
    if isinstance(value, dict):
        return {key: graph_safe(item) for key, item in value.items()}
    if isinstance(value, list):
        return [graph_safe(item) for item in value]
    if isinstance(value, int) and not isinstance(value, bool) and not INT64[0] <= value <= INT64[1]:
        return str(value)
    return value


def _json_default(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if is_dataclass(value) and not isinstance(value, type):
        return asdict(value)
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    return str(value)


# -- the saver's connection ------------------------------------------------------------------

_saver_connections = threading.local()


def _saver_for(ctx: StepContext) -> PlatformSaver:
    """The saver of the run this thread drives, kept from step to step of one claim (its
    lease epoch): what it remembers (the lists it wrote) spares each superstep reading the
    thread's message chain again."""
    conn, key = _saver_connection(), (connection.schema_name, ctx.run_id, ctx.epoch)
    kept = getattr(_saver_connections, "saver", None)
    if kept is None or kept[0] != key or kept[1].conn is not conn:
        saver = PlatformSaver(conn, schema=key[0], fence=Fence(ctx.run_id, ctx.epoch))
        kept = _saver_connections.saver = (key, saver)
    return kept[1]


def _saver_connection() -> psycopg.Connection:
    """This worker thread's own connection for the graph's checkpoints. LangGraph writes them
    from its executor threads, and a Django connection belongs to one thread. One idle for a
    while is asked first whether it still works (a restart or a pooler may have closed it)."""
    conn = getattr(_saver_connections, "conn", None)
    idle = time.monotonic() - getattr(_saver_connections, "used_at", 0.0)
    if conn is not None and not (conn.closed or conn.broken) and idle > SAVER_IDLE_CHECK_SECONDS:
        try:
            conn.execute("SELECT 1")
        except psycopg.Error:
            conn.close()
    if conn is None or conn.closed or conn.broken:
        params = connection.get_connection_params()
        params.pop("cursor_factory", None)
        params.pop("context", None)
        conn = _saver_connections.conn = psycopg.connect(**params, autocommit=True)
    _saver_connections.used_at = time.monotonic()
    return conn


# -- effects inside nodes ------------------------------------------------------------------

@dataclass
class _Running:
    """The step that is driving the graph, for the nodes it runs (LangGraph copies context
    variables into its executor threads)."""

    ctx: StepContext
    thread: int  # the step's own thread: the one whose database connection is the tenant's
    schema: str


_running: ContextVar[_Running | None] = ContextVar("graph_step", default=None)


def effect(name: str, connector: str, *, credential: str = "default", **args) -> Any:
    """In a node or `@task` of a graph the platform runs: do something externally visible
    once per (task, name), through the effect ledger (as `ctx.effect`)."""
    running, key = _task()
    return _on_tenant_connection(running, lambda: running.ctx.effect_at(
        key, name, connector, credential=credential, **args))


def model(messages: list[dict], *, name: str | None = None, model: str | None = None,
          max_tokens: int = 1024, credential: str = "default", **options) -> dict:
    """In a node or `@task` of a graph the platform runs: a model call through the ledger
    (as `ctx.model`), never made or paid for twice. Unnamed, a call is named by what it asks
    (a digest of its arguments), so a node run again, by the platform or by LangGraph's own
    retry, finds its answers whatever it asked before; the same question twice in one task
    gets the one answer (name them to ask twice)."""
    running, key = _task()
    if name is None:
        asked = json.dumps([messages, model, max_tokens, credential, options], sort_keys=True,
                           default=str)
        name = "model-" + hashlib.sha256(asked.encode()).hexdigest()[:16]
    return _on_tenant_connection(running, lambda: running.ctx.model_at(
        key, messages, name=name, model=model, max_tokens=max_tokens, credential=credential,
        **options))


def _task() -> tuple[_Running, str]:
    """The running step, and the ledger key of the LangGraph task calling: "g" and its id."""
    running = _running.get()
    if running is None:
        raise RuntimeError("effect() and model() work in a graph run by the platform "
                           "(Agent.from_langgraph), inside a node or a @task")
    namespace = get_config().get("configurable", {}).get("checkpoint_ns", "")
    task_id = namespace.rpartition("|")[2].rpartition(":")[2].replace("-", "")
    if not task_id:
        raise RuntimeError("effect() and model() are called inside a node or a @task")
    return running, "g" + task_id


def _on_tenant_connection(running: _Running, call: Callable[[], Any]) -> Any:
    """Run `call` on the step's thread's terms: there as it is; from one of LangGraph's
    executor threads (a superstep with parallel tasks), in a thread of its own with its own
    connection to the tenant's schema, closed afterwards."""
    if threading.get_ident() == running.thread:
        return call()
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            connection.set_schema(running.schema)
            outcome["value"] = call()
        except BaseException as exc:  # handed to the calling task, which raises it
            outcome["error"] = exc
        finally:
            connection.close()

    worker = threading.Thread(target=run, name="graph-effect")
    worker.start()
    worker.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
