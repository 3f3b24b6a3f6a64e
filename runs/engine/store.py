"""Every epoch-fenced statement of the engine, in one place to audit.

A run (or a fan-out branch) is claimed with a lease (owner, epoch, expiry) in one atomic
UPDATE on the database clock; every write made under the lease is fenced on the epoch, so a
worker that lost its lease stops at its next write (LeaseLost) instead of overwriting its
successor's work. The checkpoint is one statement: run row, checkpoint, log entries and
outbox; with notifications, the tenant's row in the due-index (public) is a statement of its
own in the same transaction (a statement never mixes a tenant's tables with public ones:
decision 0023).
"""

import functools
import json
from datetime import timedelta
from typing import TYPE_CHECKING, Any
from uuid import UUID

from django.conf import settings
from django.db import connection, transaction
from django.db.models import JSONField
from django.utils import timezone

from agentplatform.metrics import lease_takeovers
from agentplatform.prepared import prepared_row
from runs.dispatch.models import TenantDue
from runs.dispatch.services import due_mark_sql
from runs.effects.models import OutboxMessage

from ..leases import fenced_write_refused
from ..models import Branch, Checkpoint, LogEntry, Run, RunEvent
from .outcome import LeaseLost
from .ports import ports

if TYPE_CHECKING:
    from .writer import Position


def _claim_sql(table: str, returning: str) -> str:
    """The claim: take the run's lease if it is runnable and nobody holds a live lease (epoch
    + 1, on the database clock), counting the claim. `before` is the row as this statement
    found it, to tell a takeover (someone's expired lease) from a claim of a queued run."""
    return f"""
        UPDATE {table} r
           SET status = 'running', lease_owner = %s, lease_epoch = r.lease_epoch + 1,
               lease_expires_at = now() + %s, started_at = coalesce(r.started_at, now()),
               claims_without_checkpoint = r.claims_without_checkpoint + 1,
               updated_at = now()
          FROM (SELECT status AS was, lease_owner AS held_by FROM {table} WHERE id = %s) before
         WHERE r.id = %s AND r.status IN ('queued', 'running')
           AND (r.lease_expires_at IS NULL OR r.lease_expires_at < now())
     RETURNING {returning}, before.was = 'running' AND before.held_by <> '' AS takeover
    """


def run_claim(*, run_id: UUID, owner: str, lease_seconds: float | None = None) -> int | None:
    """Take the run's lease if it is runnable and nobody holds a live lease. Returns the epoch.

    Counts the claim: a run claimed again and again without a new checkpoint (its step kills
    the worker) is parked for a person by `advance` instead of being claimed forever."""
    ttl = timedelta(seconds=lease_seconds or settings.RUN_LEASE_SECONDS)
    with connection.cursor() as cursor:
        cursor.execute(_claim_sql(Run._meta.db_table, "r.lease_epoch"),
                       [owner, ttl, run_id, run_id])
        row = cursor.fetchone()
    if row and row[1]:
        lease_takeovers.add(1, {"of": "run"})
    return row[0] if row else None


def run_claim_read(*, run_id: UUID, owner: str) -> Run | None:
    """`run_claim`, returning the claimed run's row as the claim left it (its `lease_epoch` is
    the claim's): the claim and the read of the run are one statement, not two, prepared."""
    ttl = timedelta(seconds=settings.RUN_LEASE_SECONDS)
    row = prepared_row(_claim_sql(f'"{connection.schema_name}".{Run._meta.db_table}',
                               ", ".join(f"r.{column}" for column in RUN_COLUMNS)),
                    [owner, ttl, run_id, run_id])
    if row is None:
        return None
    *values, takeover = row
    if takeover:
        lease_takeovers.add(1, {"of": "run"})
    return _model_of(Run, values)


def run_unclaim(*, run: Run, epoch: int) -> None:
    """Give the claim back uncounted: queued, no lease, as if this worker never took it."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {Run._meta.db_table} SET status = 'queued', lease_owner = '', "
            "lease_expires_at = NULL, updated_at = now(), "
            "claims_without_checkpoint = greatest(claims_without_checkpoint - 1, 0) "
            "WHERE id = %s AND lease_epoch = %s",
            [run.id, epoch],
        )
        if cursor.rowcount == 0:
            raise LeaseLost(fenced_write_refused(
                write="run", detail=f"run {run.id}: lease epoch {epoch} was taken over"))


def _run_assignments(run: Run, fields: dict[str, Any]) -> tuple[str, list[Any]]:
    """SET clause for the run row: counters, lease extension (unless released), `fields`."""
    values = {"steps_taken": run.steps_taken, "active_seconds": run.active_seconds, **fields}
    sql = ["updated_at = now()", "claims_without_checkpoint = 0"]  # progress: not a poison step
    params: list[Any] = []
    if "lease_owner" not in fields:
        sql.append("lease_expires_at = now() + %s")
        params.append(timedelta(seconds=settings.RUN_LEASE_SECONDS))
    for name, value in values.items():
        column = Run._meta.get_field(name)
        sql.append(f"{column.column} = %s")
        params.append(column.get_db_prep_save(value, connection))
    return ", ".join(sql), params


def _checkpoint_sql(schema: str, fence: str, entries: int, outbox: bool,
                    event: bool = False) -> str:
    """The checkpoint statement: the fence (the run row's UPDATE, or its FOR SHARE read), the
    checkpoint, and the log entries, outbox messages and end event if there are any. `entries`:
    0, 1 (the entry's fields as parameters: most steps append one value) or 2 (many: one JSON
    list, psycopg dumps one string in C where it dumped four arrays in Python). Each other list
    is one JSON parameter too. A JSON null comes out of `jsonb_to_recordset` as SQL NULL:
    coalesced back to a JSON null."""
    sql = [f"""
        WITH fence AS (
            {fence}
        ), checkpoint AS (
            INSERT INTO "{schema}".{Checkpoint._meta.db_table}
                   (run_id, visit, step, state, log_offsets, agent_version, topology_hash,
                    waiting, created_at)
            SELECT id, %s, %s, %s::jsonb, %s::jsonb, %s, %s, %s::jsonb, now() FROM fence
        )"""]
    if entries == 1:  # most steps append one value: its fields as parameters, no JSON list
        sql.append(f""", entries AS (
            INSERT INTO "{schema}".{LogEntry._meta.db_table} (run_id, log, index, visit, value)
            SELECT fence.id, %s, %s, %s, %s::jsonb FROM fence
        )""")
    elif entries:
        sql.append(f""", entries AS (
            INSERT INTO "{schema}".{LogEntry._meta.db_table} (run_id, log, index, visit, value)
            SELECT fence.id, e.log, e.index, e.visit, coalesce(e.value, 'null')  -- a JSON null
              FROM fence, jsonb_to_recordset(%s::jsonb)
                   AS e(log text, index int, visit int, value jsonb)
        )""")
    if outbox:
        sql.append(f""", outbox AS (
            INSERT INTO "{schema}".{OutboxMessage._meta.db_table}
                   (run_id, name, connector, args, idempotency_key, status, attempts,
                    next_attempt_at, last_error, created_at)
            SELECT fence.id, o.name, o.connector, coalesce(o.args, 'null'), o.key, 'pending', 0,
                   now(), '', now()
              FROM fence, jsonb_to_recordset(%s::jsonb)
                   AS o(name text, connector text, args jsonb, key text)
            ON CONFLICT (idempotency_key) DO NOTHING
        )""")
    if event:  # the run's last event (its end), with its last checkpoint
        sql.append(f""", event AS (
            INSERT INTO "{schema}".{RunEvent._meta.db_table} (run_id, kind, visit, data, created_at)
            SELECT fence.id, %s, %s, %s::jsonb, %s FROM fence
        )""")
    sql.append(" SELECT cancel_requested FROM fence")
    return "".join(sql)


@functools.lru_cache(maxsize=1024)
def _checkpoint_fenced_sql(schema: str, entries: int, outbox: bool) -> str:
    """The statement of a checkpoint that leaves the run row untouched (most of them): one text
    per shape (entries 0, 1 or many; outbox or not), built once, for every step of every run of
    the schema."""
    return _checkpoint_sql(schema, f"""SELECT id, cancel_requested FROM "{schema}".{
        Run._meta.db_table} WHERE id = %s AND lease_epoch = %s FOR SHARE""", entries, outbox)


def checkpoint_commit(*, run: Run, epoch: int, position: "Position", touch_run: bool = True,
                      event: RunEvent | None = None, schema: str | None = None,
                      **run_fields) -> bool:
    """Write a checkpoint, its new log entries, `event` (a run's end, from `event_row`) and,
    if `touch_run` (or `run_fields`), the run's counters and lease in one statement, fenced on
    the lease epoch: if the epoch moved on, nothing is written and LeaseLost is raised.
    Untouched, the run row is only read FOR SHARE: a takeover's claim (an UPDATE of the row)
    waits for this commit, so the fence holds, and the step writes no new version of the run
    row. Returns whether a cancel was requested. `schema` is the run's tenant's (its writer
    knows it: the connection's, asked through Django's proxy, cost a step 4 µs)."""
    if event is not None and not (touch_run or run_fields):
        raise ValueError("an event is written with the run's fields (its end)")
    entries, outbox = position.pending_entries, position.pending_outbox
    schema = schema or connection.schema_name
    if touch_run or run_fields:
        assignments, params = _run_assignments(run, run_fields)
        sql = _checkpoint_sql(schema, f"""UPDATE "{schema}".{Run._meta.db_table} SET {assignments}
                                            WHERE id = %s AND lease_epoch = %s
                                        RETURNING id, cancel_requested""",
                              min(len(entries), 2), bool(outbox), event is not None)
    else:
        params, sql = [], _checkpoint_fenced_sql(schema, min(len(entries), 2), bool(outbox))
    params += [
        run.id, epoch,
        position.visit, position.step,
        json.dumps(position.state) if position.state_json is None else position.state_json,
        json.dumps(position.offsets), run.agent_version, run.topology_hash,
        None if position.waiting is None else json.dumps(position.waiting, default=str),
    ]
    if len(entries) == 1:
        entry, = entries
        params += [entry["log"], entry["index"], entry["visit"], json.dumps(entry["value"])]
    elif entries:
        params.append(json.dumps(entries))
    if outbox:
        params.append(json.dumps([{"name": n["name"], "connector": n["connector"],
                                   "args": n["args"], "key": n["key"]} for n in outbox],
                                 default=str))
    if event is not None:  # stamped on the worker's clock, as every event `event_record` writes
        params += [event.kind, event.visit, json.dumps(event.data), timezone.now()]
    if outbox:
        # The messages and the tenant's mark in the due-index commit together; inside a
        # caller's transaction no savepoint is needed (a failure there fails it whole).
        with transaction.atomic(savepoint=False):
            row = prepared_row(sql, params)
            if row is not None:
                prepared_row(due_mark_sql(), [TenantDue.What.OUTBOX.value, None, schema])
        ports().outbox_kick()  # rings now if committed, else when the atomic caller commits
    else:
        row = prepared_row(sql, params)
    if row is None:
        raise LeaseLost(fenced_write_refused(write="checkpoint", detail=(
            f"run {run.id}: lease epoch {epoch} was taken over "
            f"(checkpoint {position.visit} not written)")))
    return row[0]


def run_fence(*, run: Run, epoch: int, visit: int | None = None, **fields) -> bool:
    """Update the run's counters and `fields` only if our lease epoch still holds."""
    assignments, params = _run_assignments(run, fields)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {Run._meta.db_table} SET {assignments} WHERE id = %s AND lease_epoch = %s "
            "RETURNING cancel_requested",
            params + [run.id, epoch],
        )
        row = cursor.fetchone()
    if row is None:
        raise LeaseLost(fenced_write_refused(write="run", detail=(
            f"run {run.id}: lease epoch {epoch} was taken over (at visit {visit})")))
    return row[0]



def _columns(model) -> tuple[str, ...]:
    return tuple(field.column for field in model._meta.concrete_fields)


RUN_COLUMNS, CHECKPOINT_COLUMNS = _columns(Run), _columns(Checkpoint)


def _model_of(model, values: list[Any]):
    """A model instance from a row of its concrete columns, in order, read on the raw
    connection: JSON columns arrive as text (Django's loader), so they are parsed here."""
    fields = model._meta.concrete_fields
    return model.from_db(connection.alias, [field.attname for field in fields], [
        json.loads(value) if isinstance(value, str) and isinstance(field, JSONField) else value
        for field, value in zip(fields, values, strict=True)])


def checkpoint_latest(*, run: Run) -> Checkpoint | None:
    """The run's newest checkpoint (run_start writes visit 0): read once per claim, as a
    prepared statement rather than through the ORM (whose query building was a tenth of a
    worker's CPU in `bench throughput`)."""
    row = prepared_row(f"""SELECT {", ".join(CHECKPOINT_COLUMNS)}
                          FROM "{connection.schema_name}".{Checkpoint._meta.db_table}
                         WHERE run_id = %s ORDER BY visit DESC LIMIT 1""", [run.id])
    return None if row is None else _model_of(Checkpoint, row)


def checkpoint_at(*, run: Run, visit: int) -> Checkpoint:
    return run.checkpoints.get(visit=visit)


def branch_claim(*, run_id: UUID, index: int, owner: str) -> Branch | None:
    """Take the branch's lease (epoch + 1, database clock) if it is pending or its holder's
    lease expired, in one statement; counts the attempt."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            UPDATE {Branch._meta.db_table} b
               SET status = 'running', lease_owner = %s, lease_epoch = b.lease_epoch + 1,
                   lease_expires_at = now() + %s, attempts = b.attempts + 1
              FROM (SELECT id, status AS was FROM {Branch._meta.db_table}
                     WHERE run_id = %s AND index = %s
                       AND status IN ('pending', 'running')
                     ORDER BY visit DESC LIMIT 1) pick
             WHERE b.id = pick.id
               AND (b.status = 'pending'
                    OR (b.status = 'running' AND b.lease_expires_at < now()))
         RETURNING b.id, pick.was = 'running'
            """,
            [owner, timedelta(seconds=settings.RUN_LEASE_SECONDS), run_id, index],
        )
        row = cursor.fetchone()
    if row and row[1]:
        lease_takeovers.add(1, {"of": "branch"})
    return Branch.objects.get(id=row[0]) if row else None



def branch_fence(branch: Branch, **fields) -> None:
    """Update the branch row only if its lease epoch still holds."""
    written = Branch.objects.filter(id=branch.id, lease_epoch=branch.lease_epoch).update(**fields)
    if not written:
        raise LeaseLost(fenced_write_refused(write="branch", detail=(
            f"branch {branch.index} of run {branch.run_id} was taken over")))
