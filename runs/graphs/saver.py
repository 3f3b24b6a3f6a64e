"""LangGraph's checkpointer on the platform: `PlatformSaver` (sync) and `AsyncPlatformSaver` keep
a graph's checkpoints, channel values and pending writes in a tenant's schema
(`runs.graphs.models`), and this module owns every statement on those tables.

Both are small drivers over one sans-IO core (`SaverCore`): each operation is a generator that
yields `Query`s and is sent back their rows, so the SQL, serialization, suffix deltas and the
assembly of tuples exist once. A channel's value is stored once per version; a list that
extends the list its channel held at the parent checkpoint is stored as the appended suffix on
top of that version, so a thread that appends a message per step stores each message once, and
a read puts a list back together from its chain of suffixes, fetched in one query.

With a `Fence`, every write is one statement that takes the run's row FOR SHARE at the lease
epoch first: once another worker has taken the run over, nothing is written and LeaseLost is
raised. Deleting (threads, runs, prune) while another writer appends to the same thread is
not safe: a value it is about to reuse may be swept.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Generator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any, NamedTuple
from uuid import UUID

import psycopg
from django.conf import settings
from django.db import connection
from django_tenants.utils import get_public_schema_name
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_serializable_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol
from psycopg import sql

from runs.engine import LeaseLost
from runs.leases import fenced_write_refused
from runs.models import Run

from .models import GraphBlob, GraphCheckpoint, GraphWrite

RECENT_CHECKPOINTS = 64  # channel versions of the checkpoints last written or read
RECENT_LISTS = 128  # list values last written or read, as stored
PRUNE_STRATEGIES = ("keep_latest", "delete")


@dataclass(frozen=True)
class Fence:
    """The lease a platform run holds on the thread: writes happen only while the run's
    `lease_epoch` is still `epoch`."""

    run_id: UUID | str
    epoch: int


class Query(NamedTuple):
    sql: str
    params: dict[str, Any]
    prepare: bool = False  # the hot path (put, put_writes): planned once per connection


Rows = list[tuple]
BlobKey = tuple[str, str, str, str]  # thread_id, checkpoint_ns, channel, version
Steps = Generator[Query, Rows, Any]


class _Blob(NamedTuple):
    channel: str
    version: str
    value: Any  # the whole value, or the suffix appended to `base_version`'s list
    base_version: str | None


class _Recent:
    """A small LRU shared by the threads using one saver."""

    def __init__(self, size: int):
        self.size, self.entries, self.lock = size, OrderedDict(), threading.Lock()

    def get(self, key: tuple) -> Any:
        with self.lock:
            value = self.entries.get(key)
            if value is not None:
                self.entries.move_to_end(key)
            return value

    def put(self, key: tuple, value: Any) -> None:
        with self.lock:
            self.entries[key] = value
            self.entries.move_to_end(key)
            while len(self.entries) > self.size:
                self.entries.popitem(last=False)

    def clear(self) -> None:
        with self.lock:
            self.entries.clear()


def _own(value: Any) -> Any:
    """A list handed to a caller is its own: appending to it changes nothing stored."""
    return list(value) if type(value) is list else value


class SaverCore(BaseCheckpointSaver[str]):
    """Everything but the I/O. Each `_op` method is a generator of `Query`s that is sent the
    rows of each and returns the operation's result; the drivers below execute them.

    To tell an append from a replacement without reading the parent back, the saver remembers
    the channel versions of recent checkpoints and recent list values as stored (copied, so a
    caller appending to its list later changes nothing here); on a miss it reads them."""

    def __init__(self, *, schema: str | None, fence: Fence | None,
                 serde: SerializerProtocol | None):
        super().__init__(serde=serde)
        schema = connection.schema_name if schema is None else schema
        if not schema or schema == get_public_schema_name():
            raise ValueError("a LangGraph saver stores in a tenant's schema: select a tenant "
                             f"or pass schema= (not {schema!r})")
        self.schema, self.fence = schema, fence
        quoted = sql.Identifier(schema).as_string(None)
        self.checkpoints = f"{quoted}.{GraphCheckpoint._meta.db_table}"
        self.blobs = f"{quoted}.{GraphBlob._meta.db_table}"
        self.writes = f"{quoted}.{GraphWrite._meta.db_table}"
        self.runs = f"{quoted}.{Run._meta.db_table}"
        self.recent_versions = _Recent(RECENT_CHECKPOINTS)
        self.recent_lists = _Recent(RECENT_LISTS)

    def get_next_version(self, current: str | int | float | None, channel: None = None) -> str:
        """A counter that sorts as a string, and a random part: two forks of one checkpoint
        never give different values the same version."""
        number = 0 if current is None else int(str(current).split(".")[0])
        return f"{number + 1:010}.{random.randrange(10**16):016}"

    # -- reads ------------------------------------------------------------------------------------
    def _get_tuple_op(self, config: RunnableConfig) -> Steps:
        conf = config["configurable"]
        thread_id, ns = str(conf["thread_id"]), conf.get("checkpoint_ns", "")
        where = ["c.thread_id = %(thread_id)s", "c.checkpoint_ns = %(checkpoint_ns)s"]
        params = {"thread_id": thread_id, "checkpoint_ns": ns}
        # The latest is the one written last, by the database's clock: a checkpoint id is the
        # writer's wall clock, and a worker whose clock is behind the previous writer's would
        # otherwise put its checkpoint under its parent (and a graph run would end early).
        order = "c.created_at DESC, c.checkpoint_id DESC"
        if checkpoint_id := get_checkpoint_id(config):
            where.append("c.checkpoint_id = %(checkpoint_id)s")
            params["checkpoint_id"] = checkpoint_id
        rows = yield self._select(where, params, limit=1, order=order)
        tuples, values = yield from self._tuples(rows)
        if not tuples:
            return None
        # A graph resumed from here puts its next checkpoint on this one: remember it.
        found = tuples[0]
        self.recent_versions.put((thread_id, ns, found.checkpoint["id"]),
                                 dict(found.checkpoint["channel_versions"]))
        for key, value in values.items():
            if type(value) is list:
                self.recent_lists.put(key, value)  # `_tuple` handed out copies
        return found

    def _list_op(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None,
                 before: RunnableConfig | None, limit: int | None) -> Steps:
        where, params = [], {}
        conf = (config or {}).get("configurable", {})
        if conf.get("thread_id") is not None:
            where.append("c.thread_id = %(thread_id)s")
            params["thread_id"] = str(conf["thread_id"])
        if conf.get("checkpoint_ns") is not None:
            where.append("c.checkpoint_ns = %(checkpoint_ns)s")
            params["checkpoint_ns"] = conf["checkpoint_ns"]
        if conf.get("checkpoint_id"):
            where.append("c.checkpoint_id = %(checkpoint_id)s")
            params["checkpoint_id"] = conf["checkpoint_id"]
        if filter:
            where.append("c.metadata @> %(filter)s::jsonb")
            params["filter"] = json.dumps(filter)
        if before is not None and (before_id := get_checkpoint_id(before)):
            where.append("c.checkpoint_id < %(before)s")
            params["before"] = before_id
        rows = yield self._select(where, params, limit=limit)
        tuples, _ = yield from self._tuples(rows)
        return tuples

    def _select(self, where: list[str], params: dict[str, Any], limit: int | None,
                order: str = "c.checkpoint_id DESC") -> Query:
        """Checkpoint rows, newest first, each with its pending writes in the order LangGraph
        applies them (`writes_sort_key`: task path, task id, index; byte order, as Python's)."""
        params = {**params, "limit": limit}
        return Query(f"""
            SELECT c.thread_id, c.checkpoint_ns, c.checkpoint_id, c.parent_checkpoint_id, c.type,
                   c.checkpoint, c.channel_versions::text, c.metadata::text,
                   ARRAY(SELECT ARRAY[convert_to(w.task_id, 'UTF8'), convert_to(w.channel, 'UTF8'),
                                      convert_to(w.type, 'UTF8'), w.blob]
                           FROM {self.writes} w
                          WHERE w.thread_id = c.thread_id AND w.checkpoint_ns = c.checkpoint_ns
                            AND w.checkpoint_id = c.checkpoint_id
                          ORDER BY w.task_path COLLATE "C", w.task_id COLLATE "C", w.idx)
              FROM {self.checkpoints} c
             {"WHERE " + " AND ".join(where) if where else ""}
             ORDER BY {order}
             {"" if limit is None else "LIMIT %(limit)s"}""", params)

    def _tuples(self, rows: Rows) -> Steps:
        """CheckpointTuples of checkpoint rows, and the values read for them by key."""
        rows = [(*row[:6], json.loads(row[6]), json.loads(row[7]), row[8]) for row in rows]
        keys = {(row[0], row[1], channel, str(version))
                for row in rows for channel, version in row[6].items()}
        # A version's value never changes: the lists this saver remembers are not read again.
        values = {key: value for key in keys if (value := self.recent_lists.get(key)) is not None}
        values.update((yield from self._values_op(keys - values.keys())))
        return [self._tuple(row, values) for row in rows], values

    def _tuple(self, row: tuple, values: dict[BlobKey, Any]) -> CheckpointTuple:
        thread_id, ns, checkpoint_id, parent_id, type_, body, versions, metadata, writes = row
        checkpoint = self.serde.loads_typed((type_, body))
        checkpoint["channel_versions"] = versions
        checkpoint["channel_values"] = {
            channel: _own(values[key]) for channel, version in versions.items()
            if (key := (thread_id, ns, channel, str(version))) in values}
        return CheckpointTuple(
            config={"configurable": {"thread_id": thread_id, "checkpoint_ns": ns,
                                     "checkpoint_id": checkpoint_id}},
            checkpoint=checkpoint,
            metadata=metadata,
            parent_config={"configurable": {"thread_id": thread_id, "checkpoint_ns": ns,
                                            "checkpoint_id": parent_id}} if parent_id else None,
            pending_writes=[(task_id.decode(), channel.decode(),
                             self.serde.loads_typed((type_.decode(), blob)))
                            for task_id, channel, type_, blob in writes],
        )

    def _values_op(self, keys: set[BlobKey]) -> Steps:
        """The values stored under `keys`, each with the chain of blobs beneath it fetched in one
        query. A key with no blob (an empty channel) is left out."""
        if not keys:
            return {}
        threads, namespaces, channels, versions = (list(column) for column in zip(*keys, strict=True))
        rows = yield Query(f"""
            WITH RECURSIVE chain(thread_id, checkpoint_ns, channel, version) AS (
                SELECT * FROM unnest(%(threads)s::text[], %(namespaces)s::text[],
                                     %(channels)s::text[], %(versions)s::text[])
              UNION
                SELECT b.thread_id, b.checkpoint_ns, b.channel, b.base_version
                  FROM chain JOIN {self.blobs} b USING (thread_id, checkpoint_ns, channel, version)
                 WHERE b.base_version IS NOT NULL
            )
            SELECT b.thread_id, b.checkpoint_ns, b.channel, b.version, b.base_version, b.type, b.blob
              FROM chain JOIN {self.blobs} b USING (thread_id, checkpoint_ns, channel, version)""",
            {"threads": threads, "namespaces": namespaces, "channels": channels,
             "versions": versions})
        return self._assemble(rows, keys)

    def _assemble(self, rows: Rows, keys: set[BlobKey]) -> dict[BlobKey, Any]:
        """Each key's value: its whole blob, or the list beneath it with the suffixes above added
        in one pass, so a list of n items costs O(n). Older versions go first, so that a newer
        one starts from the list already assembled instead of walking the whole chain again."""
        stored = {tuple(row[:4]): row[4:] for row in rows}
        values: dict[BlobKey, Any] = {}
        for key in sorted(keys & stored.keys(), key=lambda k: (len(k[3]), k[3])):
            suffixes, at = [], key
            while at not in values:
                if at not in stored:
                    raise LookupError(f"LangGraph blob {at} is missing under {key}")
                base_version, type_, blob = stored[at]
                part = self.serde.loads_typed((type_, blob))
                if base_version is None:
                    start = part
                    break
                suffixes.append(part)
                at = (*at[:3], base_version)
            else:
                start = values[at]
            if suffixes:
                start = list(start)
                for suffix in reversed(suffixes):
                    start.extend(suffix)
            values[key] = start
        return values

    # -- writes -----------------------------------------------------------------------------------
    def _write(self, ctes: list[str], params: dict[str, Any], *columns: str,
               prepare: bool = False) -> Query:
        """One statement: the fence, the `ctes` that write (each guarded by the fence) and a
        row saying whether the fence held, with `columns`."""
        if self.fence is None:
            fence = "fence AS (SELECT 1)"
        else:
            fence = (f"fence AS (SELECT 1 FROM {self.runs} WHERE id = %(fence_run)s::uuid "
                     "AND lease_epoch = %(fence_epoch)s FOR SHARE)")
            params = {**params, "fence_run": str(self.fence.run_id), "fence_epoch": self.fence.epoch}
        return Query(f"WITH RECURSIVE {fence},\n" + ",\n".join(ctes)
                     + f"\nSELECT {', '.join(['EXISTS (SELECT FROM fence)', *columns])}",
                     params, prepare)

    def _fenced(self, rows: Rows, what: str) -> tuple:
        if not rows[0][0]:
            raise LeaseLost(fenced_write_refused(write="checkpoint", detail=(
                f"run {self.fence.run_id}: lease epoch {self.fence.epoch} was taken over "
                f"({what} not written)")))
        return rows[0]

    def _put_op(self, config: RunnableConfig, checkpoint: Checkpoint,
                metadata: CheckpointMetadata, new_versions: ChannelVersions) -> Steps:
        conf = config["configurable"]
        thread_id, ns = str(conf["thread_id"]), conf.get("checkpoint_ns", "")
        values = checkpoint["channel_values"]
        changed = {channel: str(version) for channel, version in new_versions.items()
                   if channel in values}
        bases = yield from self._bases_op(thread_id, ns, conf.get("checkpoint_id"),
                                          [c for c in changed if type(values[c]) is list])
        blobs = []
        for channel, version in changed.items():
            value, (base_version, base) = values[channel], bases.get(channel, (None, None))
            if base is not None and base_version != version and value[:len(base)] == base:
                blobs.append(_Blob(channel, version, value[len(base):], base_version))
            else:
                blobs.append(_Blob(channel, version, value, None))
        rows = yield self._put_query(config, checkpoint, metadata, blobs)
        if unbased := set(self._fenced(rows, f"checkpoint {checkpoint['id']}")[1]):
            # A base this saver remembered is gone (deleted, or its transaction rolled back).
            blobs = [b._replace(value=values[b.channel], base_version=None)
                     for b in blobs if b.channel in unbased]
            self._fenced((yield self._put_query(config, checkpoint, metadata, blobs)),
                         f"checkpoint {checkpoint['id']}")
        self.recent_versions.put((thread_id, ns, checkpoint["id"]),
                                 dict(checkpoint["channel_versions"]))
        for channel, version in changed.items():
            if type(values[channel]) is list:
                self.recent_lists.put((thread_id, ns, channel, version), list(values[channel]))
        return {"configurable": {"thread_id": conf["thread_id"], "checkpoint_ns": ns,
                                 "checkpoint_id": checkpoint["id"]}}

    def _bases_op(self, thread_id: str, ns: str, parent_id: str | None,
                  channels: list[str]) -> Steps:
        """{channel: (version, list)} for each of `channels` that held a list at the parent
        checkpoint: from memory, else read."""
        if not parent_id or not channels:
            return {}
        versions = self.recent_versions.get((thread_id, ns, parent_id))
        if versions is None:
            rows = yield Query(
                f"SELECT channel_versions::text FROM {self.checkpoints} WHERE thread_id = "
                "%(thread_id)s AND checkpoint_ns = %(checkpoint_ns)s AND checkpoint_id = %(id)s",
                {"thread_id": thread_id, "checkpoint_ns": ns, "id": parent_id})
            if not rows:
                return {}
            versions = json.loads(rows[0][0])
        keys = {channel: (thread_id, ns, channel, str(versions[channel]))
                for channel in channels if channel in versions}
        lists = {channel: self.recent_lists.get(key) for channel, key in keys.items()}
        if missing := {keys[channel] for channel, value in lists.items() if value is None}:
            read = yield from self._values_op(missing)
            lists.update({key[2]: read.get(key) for key in missing})
        return {channel: (keys[channel][3], value) for channel, value in lists.items()
                if type(value) is list}

    def _put_query(self, config: RunnableConfig, checkpoint: Checkpoint,
                   metadata: CheckpointMetadata, blobs: list[_Blob]) -> Query:
        """The checkpoint row (without its values) and the blobs of its new versions. A suffix
        whose base is not stored is not written either: its channel is returned, to be stored
        whole."""
        conf = config["configurable"]
        body = {k: v for k, v in checkpoint.items() if k not in ("channel_values", "channel_versions")}
        body_type, body_bytes = self.serde.dumps_typed(body)
        dumped = [self.serde.dumps_typed(blob.value) for blob in blobs]
        params = {
            "thread_id": str(conf["thread_id"]), "checkpoint_ns": conf.get("checkpoint_ns", ""),
            "checkpoint_id": checkpoint["id"], "parent_id": conf.get("checkpoint_id"),
            "type": body_type, "checkpoint": body_bytes,
            "versions": json.dumps(checkpoint["channel_versions"]),
            "metadata": json.dumps(get_serializable_checkpoint_metadata(config, metadata),
                                   default=str),
            "channels": [b.channel for b in blobs], "blob_versions": [b.version for b in blobs],
            "types": [t for t, _ in dumped], "blobs": [data for _, data in dumped],
            "bases": [b.base_version for b in blobs],
        }
        ctes = [
            # LATERAL ... LIMIT 1: one index probe per blob (an EXISTS may be planned as a hash
            # of all the thread's blobs, which costs a put O(length of the thread)).
            f"""new_blob AS (
                SELECT b.*, b.base_version IS NULL OR base.found IS NOT NULL AS based
                  FROM unnest(%(channels)s::text[], %(blob_versions)s::text[], %(types)s::text[],
                              %(blobs)s::bytea[], %(bases)s::text[])
                       AS b(channel, version, type, blob, base_version)
                  LEFT JOIN LATERAL (
                       SELECT true AS found FROM {self.blobs} base
                        WHERE base.thread_id = %(thread_id)s
                          AND base.checkpoint_ns = %(checkpoint_ns)s
                          AND base.channel = b.channel AND base.version = b.base_version
                        LIMIT 1) base ON true
            )""",
            f"""blob AS (
                INSERT INTO {self.blobs}
                       (thread_id, checkpoint_ns, channel, version, type, blob, base_version)
                SELECT %(thread_id)s, %(checkpoint_ns)s, channel, version, type, blob, base_version
                  FROM new_blob, fence WHERE based
                ON CONFLICT DO NOTHING
            )""",
            f"""checkpoint AS (
                INSERT INTO {self.checkpoints}
                       (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type,
                        checkpoint, channel_versions, metadata, created_at)
                SELECT %(thread_id)s, %(checkpoint_ns)s, %(checkpoint_id)s, %(parent_id)s,
                       %(type)s, %(checkpoint)s, %(versions)s::jsonb, %(metadata)s::jsonb, now()
                  FROM fence
                ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id) DO UPDATE
                   SET type = excluded.type, checkpoint = excluded.checkpoint,
                       channel_versions = excluded.channel_versions, metadata = excluded.metadata
            )""",
        ]
        return self._write(ctes, params, "ARRAY(SELECT channel FROM new_blob WHERE NOT based)",
                           prepare=True)

    def _put_writes_op(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                       task_id: str, task_path: str) -> Steps:
        """A task's writes, idempotent per (task, index); special writes (errors, interrupts:
        negative indexes) replace what the task wrote there before."""
        conf = config["configurable"]
        rows = {}  # by index: a special channel written twice keeps its last value
        for idx, (channel, value) in enumerate(writes):
            index = WRITES_IDX_MAP.get(channel, idx)
            rows[index] = (index, channel, *self.serde.dumps_typed(value))
        if not rows:
            return None
        replace = all(channel in WRITES_IDX_MAP for channel, _ in writes)
        indexes, channels, types, blobs = (list(column) for column in zip(*rows.values(), strict=True))
        self._fenced((yield self._write([f"""written AS (
            INSERT INTO {self.writes} (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path,
                                       idx, channel, type, blob)
            SELECT %(thread_id)s, %(checkpoint_ns)s, %(checkpoint_id)s, %(task_id)s, %(task_path)s,
                   w.idx, w.channel, w.type, w.blob
              FROM fence, unnest(%(indexes)s::int[], %(channels)s::text[], %(types)s::text[],
                                 %(blobs)s::bytea[]) AS w(idx, channel, type, blob)
            ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx)
            {"DO UPDATE SET channel = excluded.channel, type = excluded.type, blob = excluded.blob"
             if replace else "DO NOTHING"}
        )"""], {"thread_id": str(conf["thread_id"]), "checkpoint_ns": conf.get("checkpoint_ns", ""),
                "checkpoint_id": conf["checkpoint_id"], "task_id": task_id, "task_path": task_path,
                "indexes": indexes, "channels": channels, "types": types, "blobs": blobs},
            prepare=True)), f"writes of task {task_id}")
        return None

    def _copy_thread_op(self, source_thread_id: str, target_thread_id: str) -> Steps:
        """Every checkpoint, blob and pending write of the source thread, under the target's id."""
        copies = []
        for name, table, columns in (
                ("checkpoint", self.checkpoints, "checkpoint_ns, checkpoint_id, parent_checkpoint_id, "
                                                 "type, checkpoint, channel_versions, metadata, created_at"),
                ("blob", self.blobs, "checkpoint_ns, channel, version, type, blob, base_version"),
                ("written", self.writes, "checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, "
                                         "type, blob")):
            copies.append(f"""{name} AS (
                INSERT INTO {table} (thread_id, {columns})
                SELECT %(target)s, {columns} FROM {table}, fence WHERE thread_id = %(source)s
                ON CONFLICT DO NOTHING
            )""")
        self._fenced((yield self._write(copies, {"source": str(source_thread_id),
                                                 "target": str(target_thread_id)})),
                     f"copy of thread {source_thread_id}")
        return None

    def _delete_threads_op(self, thread_ids: Sequence[str]) -> Steps:
        thread_ids = [str(t) for t in thread_ids]
        if thread_ids:
            self._fenced((yield self._write([
                f"{name} AS (DELETE FROM {table} WHERE thread_id = ANY(%(threads)s::text[]) "
                "AND EXISTS (SELECT FROM fence))"
                for name, table in (("checkpoint", self.checkpoints), ("blob", self.blobs),
                                    ("written", self.writes))],
                {"threads": thread_ids})), "deletion of threads")
            self.recent_versions.clear()
            self.recent_lists.clear()
        return None

    def _delete_for_runs_op(self, run_ids: Sequence[str]) -> Steps:
        """Checkpoints whose metadata names one of `run_ids`, their writes and the blobs no
        checkpoint left needs."""
        if run_ids:
            self._fenced((yield self._write([
                f"""doomed AS (
                    DELETE FROM {self.checkpoints}
                     WHERE metadata ->> 'run_id' = ANY(%(run_ids)s::text[])
                       AND EXISTS (SELECT FROM fence)
                 RETURNING thread_id, checkpoint_ns, checkpoint_id
                )""", *self._sweep()], {"run_ids": [str(r) for r in run_ids]})),
                "deletion of runs")
            self.recent_versions.clear()
            self.recent_lists.clear()
        return None

    def _prune_op(self, thread_ids: Sequence[str], strategy: str) -> Steps:
        """`keep_latest`: each namespace keeps its latest checkpoint, its writes and the blobs it
        reads (suffix chains included); refused for threads that use a DeltaChannel, whose
        values are rebuilt from older checkpoints' writes. `delete`: the threads are deleted."""
        if isinstance(thread_ids, str):
            raise TypeError("thread_ids must be a sequence of thread ids, not a str")
        if strategy not in PRUNE_STRATEGIES:
            raise ValueError(f"unknown prune strategy {strategy!r}: one of {PRUNE_STRATEGIES}")
        if strategy == "delete":
            return (yield from self._delete_threads_op(thread_ids))
        thread_ids = [str(t) for t in thread_ids]
        if not thread_ids:
            return None
        rows = yield self._write([
            f"""delta AS (
                SELECT EXISTS (SELECT FROM {self.checkpoints} WHERE thread_id = ANY(%(threads)s::text[])
                                  AND metadata ? 'counters_since_delta_snapshot') AS used
            )""",
            f"""latest AS (
                SELECT DISTINCT ON (thread_id, checkpoint_ns) thread_id, checkpoint_ns, checkpoint_id
                  FROM {self.checkpoints} WHERE thread_id = ANY(%(threads)s::text[])
                 ORDER BY thread_id, checkpoint_ns, checkpoint_id DESC
            )""",
            f"""doomed AS (
                DELETE FROM {self.checkpoints} c
                 WHERE c.thread_id = ANY(%(threads)s::text[])
                   AND EXISTS (SELECT FROM fence) AND NOT (SELECT used FROM delta)
                   AND NOT EXISTS (SELECT FROM latest l WHERE l.thread_id = c.thread_id
                                      AND l.checkpoint_ns = c.checkpoint_ns
                                      AND l.checkpoint_id = c.checkpoint_id)
             RETURNING c.thread_id, c.checkpoint_ns, c.checkpoint_id
            )""", *self._sweep()], {"threads": thread_ids}, "(SELECT used FROM delta)")
        if self._fenced(rows, "prune")[1]:
            raise NotImplementedError("prune keep_latest refuses threads that use a DeltaChannel: "
                                      "their values are rebuilt from older checkpoints")
        self.recent_versions.clear()
        self.recent_lists.clear()
        return None

    def _sweep(self) -> list[str]:
        """After a `doomed` CTE (deleted checkpoints): delete their writes, and the blobs of their
        namespaces that no checkpoint left reads, directly or beneath a suffix."""
        return [
            f"""written AS (
                DELETE FROM {self.writes} w USING doomed d
                 WHERE w.thread_id = d.thread_id AND w.checkpoint_ns = d.checkpoint_ns
                   AND w.checkpoint_id = d.checkpoint_id
            )""",
            "swept AS (SELECT DISTINCT thread_id, checkpoint_ns FROM doomed)",
            f"""live(thread_id, checkpoint_ns, channel, version) AS (
                SELECT c.thread_id, c.checkpoint_ns, v.key, v.value
                  FROM swept s JOIN {self.checkpoints} c USING (thread_id, checkpoint_ns)
                 CROSS JOIN LATERAL jsonb_each_text(c.channel_versions) v
                 WHERE NOT EXISTS (SELECT FROM doomed d WHERE d.thread_id = c.thread_id
                                      AND d.checkpoint_ns = c.checkpoint_ns
                                      AND d.checkpoint_id = c.checkpoint_id)
              UNION
                SELECT b.thread_id, b.checkpoint_ns, b.channel, b.base_version
                  FROM live JOIN {self.blobs} b USING (thread_id, checkpoint_ns, channel, version)
                 WHERE b.base_version IS NOT NULL
            )""",
            f"""blob AS (
                DELETE FROM {self.blobs} b USING swept s
                 WHERE b.thread_id = s.thread_id AND b.checkpoint_ns = s.checkpoint_ns
                   AND NOT EXISTS (SELECT FROM live l WHERE l.thread_id = b.thread_id
                                      AND l.checkpoint_ns = b.checkpoint_ns
                                      AND l.channel = b.channel AND l.version = b.version)
            )""",
        ]


class PlatformSaver(SaverCore):
    """The sync saver. On `conn` (a psycopg Connection in autocommit, shared by threads under a
    lock) or, without one, on the calling thread's Django connection: LangGraph calls `put` and
    `put_writes` from its background threads, which is why the schema is taken when the saver
    is made (the tenant selected then), not from the connection of the thread that calls."""

    def __init__(self, conn: psycopg.Connection | None = None, *, schema: str | None = None,
                 fence: Fence | None = None, serde: SerializerProtocol | None = None):
        super().__init__(schema=schema, fence=fence, serde=serde)
        self.conn, self.lock = conn, threading.Lock()

    @contextmanager
    def _cursor(self) -> Iterator[psycopg.Cursor]:
        if self.conn is not None:
            with self.lock, self.conn.cursor() as cursor:
                yield cursor
        else:
            connection.ensure_connection()
            with connection.wrap_database_errors, psycopg.Cursor(connection.connection) as cursor:
                yield cursor

    def _run(self, steps: Steps) -> Any:
        with self._cursor() as cursor:
            rows = None
            while True:
                try:
                    query = steps.send(rows)
                except StopIteration as done:
                    return done.value
                cursor.execute(query.sql, query.params, prepare=query.prepare or None)
                rows = cursor.fetchall() if cursor.description else []

    def setup(self) -> None:
        """Nothing to do: the tables are made by the tenant's migrations, never at run time."""

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return self._run(self._get_tuple_op(config))

    def list(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
             before: RunnableConfig | None = None, limit: int | None = None
             ) -> Iterator[CheckpointTuple]:
        yield from self._run(self._list_op(config, filter=filter, before=before, limit=limit))

    def put(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
            new_versions: ChannelVersions) -> RunnableConfig:
        return self._run(self._put_op(config, checkpoint, metadata, new_versions))

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str,
                   task_path: str = "") -> None:
        self._run(self._put_writes_op(config, writes, task_id, task_path))

    def delete_thread(self, thread_id: str) -> None:
        self._run(self._delete_threads_op([thread_id]))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        self._run(self._delete_for_runs_op(run_ids))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self._run(self._copy_thread_op(source_thread_id, target_thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        self._run(self._prune_op(thread_ids, strategy))


def _settings_connect_kwargs() -> dict[str, Any]:
    """psycopg's connection arguments for Django's default database, preparing statements as it
    does (only the hot path's, and none behind a pooler without them: DATABASE_PREPARED_STATEMENTS)."""
    db = settings.DATABASES["default"]
    kwargs = {"dbname": db["NAME"], "user": db["USER"], "password": db["PASSWORD"],
              "host": db["HOST"], "port": db["PORT"]}
    return {**{key: value for key, value in kwargs.items() if value},
            "prepare_threshold": db.get("OPTIONS", {}).get("prepare_threshold")}


class AsyncPlatformSaver(SaverCore):
    """The async saver, on `conn` (a psycopg AsyncConnection in autocommit, one operation at a
    time). Without one, it connects to Django's default database on first use; `from_settings`
    opens a connection for a `async with` block and closes it after."""

    def __init__(self, conn: psycopg.AsyncConnection | None = None, *, schema: str | None = None,
                 fence: Fence | None = None, serde: SerializerProtocol | None = None):
        super().__init__(schema=schema, fence=fence, serde=serde)
        self.conn, self.lock = conn, asyncio.Lock()

    @classmethod
    @asynccontextmanager
    async def from_settings(cls, *, schema: str | None = None, fence: Fence | None = None,
                            serde: SerializerProtocol | None = None
                            ) -> AsyncIterator[AsyncPlatformSaver]:
        async with await psycopg.AsyncConnection.connect(**_settings_connect_kwargs(),
                                                         autocommit=True) as conn:
            yield cls(conn, schema=schema, fence=fence, serde=serde)

    async def _run(self, steps: Steps) -> Any:
        async with self.lock:
            if self.conn is None:
                self.conn = await psycopg.AsyncConnection.connect(**_settings_connect_kwargs(),
                                                                  autocommit=True)
            async with self.conn.cursor() as cursor:
                rows = None
                while True:
                    try:
                        query = steps.send(rows)
                    except StopIteration as done:
                        return done.value
                    await cursor.execute(query.sql, query.params, prepare=query.prepare or None)
                    rows = await cursor.fetchall() if cursor.description else []

    async def setup(self) -> None:
        """Nothing to do: the tables are made by the tenant's migrations, never at run time."""

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await self._run(self._get_tuple_op(config))

    async def alist(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
                    before: RunnableConfig | None = None, limit: int | None = None
                    ) -> AsyncIterator[CheckpointTuple]:
        for found in await self._run(self._list_op(config, filter=filter, before=before,
                                                   limit=limit)):
            yield found

    async def aput(self, config: RunnableConfig, checkpoint: Checkpoint,
                   metadata: CheckpointMetadata, new_versions: ChannelVersions) -> RunnableConfig:
        return await self._run(self._put_op(config, checkpoint, metadata, new_versions))

    async def aput_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                          task_id: str, task_path: str = "") -> None:
        await self._run(self._put_writes_op(config, writes, task_id, task_path))

    async def adelete_thread(self, thread_id: str) -> None:
        await self._run(self._delete_threads_op([thread_id]))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await self._run(self._delete_for_runs_op(run_ids))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await self._run(self._copy_thread_op(source_thread_id, target_thread_id))

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await self._run(self._prune_op(thread_ids, strategy))
