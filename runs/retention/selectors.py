"""Retention reads: the policy that applies to a run (the run's overrides over the agent's own
policy, over the tenant's, over the platform's default), which runs are due, a run's rows in every
table that hangs off Run, and the history shape that live and archived runs share."""

import base64
import dataclasses
import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from uuid import UUID

from django.conf import settings
from django.db import models
from django.db.models import (
    Case,
    Count,
    Exists,
    ExpressionWrapper,
    F,
    Max,
    Min,
    OuterRef,
    Q,
    Subquery,
    Sum,
    Value,
    When,
)
from django.db.models.functions import Coalesce
from django.utils.duration import duration_iso_string

from runs.agents import RetentionPolicy, UnknownAgent, registry
from runs.graphs.models import GraphBlob, GraphCheckpoint, GraphWrite
from runs.models import Checkpoint, LogEntry, Run, RunEvent
from runs.serializers import CheckpointSerializer, EventSerializer, RunSerializer

from .models import Archive, RunRetention, TenantRetention


def default_policy() -> RetentionPolicy:
    return RetentionPolicy(history=settings.RETENTION_HISTORY,
                           ttl=timedelta(days=settings.RETENTION_TTL_DAYS),
                           archive_required=settings.RETENTION_ARCHIVE_REQUIRED)


def tenant_retention() -> TenantRetention | None:
    """The current tenant's own policy row, if its owners set one."""
    return TenantRetention.objects.first()


def tenant_policy() -> RetentionPolicy:
    """The current tenant's policy for agents that declare none: its own history and TTL over
    the platform's default (which keeps deciding archive_required)."""
    own = tenant_retention()
    platform = default_policy()
    return platform if own is None else dataclasses.replace(platform, history=own.history, ttl=own.ttl)


def runs_with_own_policy() -> int:
    """How many of the current tenant's runs override their policy (services.run_retention_set)."""
    return RunRetention.objects.count()


def agent_policy(*, agent: str, version: int, fallback: RetentionPolicy | None = None) -> RetentionPolicy:
    """The agent's declared policy, or else `fallback` (the tenant's policy when not given: a
    caller deciding many runs reads it once and passes it)."""
    try:
        declared = registry.get(agent, version).retention
    except UnknownAgent:
        declared = None
    return declared or fallback or tenant_policy()


def policy_for(*, agent: str, version: int, history: str | None = None,
               ttl: timedelta | None = None, archive_required: bool | None = None,
               fallback: RetentionPolicy | None = None) -> RetentionPolicy:
    """The agent's policy (or the tenant's), with the run's own non-null overrides on top."""
    override = {"history": history, "ttl": ttl, "archive_required": archive_required}
    return dataclasses.replace(agent_policy(agent=agent, version=version, fallback=fallback),
                               **{k: v for k, v in override.items() if v is not None})


RETRIED_SHARE = 10  # a tenth of a pass's batch is kept for runs whose archive failed before


def runs_due(*, now: datetime, limit: int) -> list[tuple[UUID, RetentionPolicy]]:
    """Finished runs past their TTL, with the policy that applies to each: those not tried
    before, oldest first, and a tenth of `limit` (rounded up) for those whose archive failed
    before, fewest attempts first. Room one kind leaves goes to the other: runs that fail on
    every pass do not hold back the runs behind them, and new runs do not shut them out.

    Each run's TTL is decided in the query (`_ttl`, the same rule as `policy_for`), which reads
    finished runs oldest first on their index and stops at the batch: a pass costs its batch,
    not the tenant's whole backlog of finished runs, nor a list of them held in memory."""
    fallback = tenant_policy()
    agents = [agent for agent in registry.all() if agent.retention]
    ttls = [fallback.ttl] + [agent.retention.ttl for agent in agents]
    if (shortest_override := RunRetention.objects.aggregate(ttl=Min("ttl"))["ttl"]) is not None:
        ttls.append(shortest_override)
    finished = Run.objects.filter(status__in=Run.FINISHED, finished_at__lte=now - min(ttls)).alias(
        due_at=ExpressionWrapper(F("finished_at") + _ttl(agents, fallback),
                                 output_field=models.DateTimeField())).filter(due_at__lte=now)
    failed = Exists(Archive.objects.filter(run_id=OuterRef("id"), status=Archive.Status.FAILED))
    attempts = Subquery(Archive.objects.filter(run_id=OuterRef("id")).values("attempts")[:1])
    retried_runs = finished.filter(failed).annotate(attempts=attempts).order_by(
        "attempts", "finished_at", "id")
    share = -(-limit // RETRIED_SHARE) if limit > 1 else 0  # a tenth, rounded up
    retried = _due(retried_runs, fallback=fallback, limit=share)
    fresh = _due(finished.filter(~failed).order_by("finished_at", "id"), fallback=fallback,
                 limit=limit - len(retried))
    if len(retried) == share and len(fresh) + share < limit:  # room the new runs left
        retried = _due(retried_runs, fallback=fallback, limit=limit - len(fresh))
    # Each query reads its own snapshot: a run whose archive failed in between is in both.
    taken = {run_id for run_id, _ in fresh}
    return fresh + [(run_id, policy) for run_id, policy in retried if run_id not in taken]


def _ttl(agents: list, fallback: RetentionPolicy) -> Coalesce:
    """A run's TTL as SQL: its own override, else its agent's declared TTL, else `fallback`'s."""
    declared = [When(Q(agent=agent.name, agent_version=agent.version),
                     then=Value(agent.retention.ttl)) for agent in agents]
    return Coalesce("retention_override__ttl", Case(*declared, default=Value(fallback.ttl),
                                                    output_field=models.DurationField()))


def _due(candidates: models.QuerySet, *, fallback: RetentionPolicy,
         limit: int) -> list[tuple[UUID, RetentionPolicy]]:
    """The first `limit` of `candidates` (runs due, in the order given), each with its policy."""
    if limit <= 0:
        return []
    return [(run_id, policy_for(agent=agent, version=version, history=history, ttl=ttl,
                                archive_required=archive_required, fallback=fallback))
            for run_id, agent, version, history, ttl, archive_required in candidates.values_list(
                "id", "agent", "agent_version", "retention_override__history",
                "retention_override__ttl", "retention_override__archive_required")[:limit]]


def shallow_runs() -> models.QuerySet:
    """Runs (any status) whose policy keeps only the latest checkpoint."""
    explicit = [a for a in registry.all() if a.retention]
    by_agent = _of_agents(a for a in explicit if a.retention.history == "shallow")
    if tenant_policy().history == "shallow":
        by_agent |= ~_of_agents(explicit)
    return Run.objects.filter(
        (by_agent & ~Q(retention_override__history="full"))
        | Q(retention_override__history="shallow")
    )


def _of_agents(agents) -> Q:
    query = Q(pk__in=[])
    for agent in agents:
        query |= Q(agent=agent.name, agent_version=agent.version)
    return query


@dataclass(frozen=True)
class RunTable:
    """A model whose rows point at a run: archived with it; deleted, or (SET_NULL) detached.
    `by_thread`: a LangGraph table, whose rows are the run's when their thread is the run."""

    model: type[models.Model]
    field: models.Field
    outlives_run: bool
    by_thread: bool = False

    @property
    def name(self) -> str:
        return self.model._meta.db_table

    def key(self, run_id: UUID) -> UUID | str:
        """What `field` holds for the run's rows."""
        return str(run_id) if self.by_thread else run_id


# A graph run's LangGraph thread is the run (runs/graphs/driver.py): its checkpoints, channel
# values and pending writes go with it. Threads of the saver used on its own are not runs'.
THREAD_TABLES = (GraphCheckpoint, GraphBlob, GraphWrite)


def run_tables() -> list[RunTable]:
    """Every table with a ForeignKey to Run, found at runtime so later apps' tables come along,
    and LangGraph's tables by thread. Forks (Run -> Run) are other runs: they are detached,
    not archived."""
    return [
        RunTable(rel.related_model, rel.field, outlives_run=rel.on_delete is models.SET_NULL)
        for rel in Run._meta.related_objects
        if not rel.many_to_many and rel.related_model is not Run
    ] + [RunTable(model, model._meta.get_field("thread_id"), outlives_run=False, by_thread=True)
         for model in THREAD_TABLES]


def run_rows(*, run_id: UUID) -> dict[str, list[dict]]:
    """The run's row and its rows in every run table, as plain JSON-ready dicts, in pk order."""
    return json.loads(json.dumps(runs_rows(run_ids=[run_id])[run_id], default=json_default))


def runs_rows(*, run_ids: list[UUID]) -> dict[UUID, dict[str, list[dict]]]:
    """Per run (of those that exist), its row and its rows in every run table, in pk order, as
    `values()` dicts (JSON-ready through `json_default`): one query per table for all of them."""
    rows: dict[UUID, dict[str, list[dict]]] = {
        row["id"]: {Run._meta.db_table: [row]} for row in Run.objects.filter(id__in=run_ids).values()}
    for table in run_tables():
        owner = {table.key(run_id): run_id for run_id in rows}
        for run_rows_ in rows.values():
            run_rows_[table.name] = []
        found = table.model._default_manager.filter(**{f"{table.field.attname}__in": list(owner)})
        for row in found.order_by("pk").values():
            rows[owner[row[table.field.attname]]][table.name].append(row)
    return rows


def json_default(value):
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, timedelta):
        return duration_iso_string(value)
    if isinstance(value, UUID | Decimal):
        return str(value)
    if isinstance(value, bytes | memoryview):
        return base64.b64encode(bytes(value)).decode()
    raise TypeError(f"cannot archive a {type(value).__name__}")


def _instances(model: type[models.Model], rows: list[dict]) -> list[models.Model]:
    fields = model._meta.concrete_fields
    return [model(**{f.attname: f.to_python(row[f.attname]) for f in fields if f.attname in row})
            for row in rows]


def history_from_rows(rows: dict[str, list[dict]]) -> dict:
    """A run's history as the API shows it: run, events, checkpoints, log entries, and the rows
    of any other run table under `related` (by table name)."""
    rows = dict(rows)
    run_rows_ = rows.pop(Run._meta.db_table)
    events = sorted(_instances(RunEvent, rows.pop(RunEvent._meta.db_table, [])), key=lambda e: e.id)
    checkpoints = sorted(_instances(Checkpoint, rows.pop(Checkpoint._meta.db_table, [])),
                         key=lambda c: c.visit)
    entries = sorted(rows.pop(LogEntry._meta.db_table, []), key=lambda e: (e["log"], e["index"]))
    return {
        "run": RunSerializer(_instances(Run, run_rows_)[0]).data,
        "events": EventSerializer(events, many=True).data,
        "checkpoints": CheckpointSerializer(checkpoints, many=True).data,
        "log_entries": [{k: e[k] for k in ("log", "index", "visit", "value")} for e in entries],
        "related": rows,
    }


def run_history(*, run_id: UUID) -> dict:
    """A live run's history in the shape a restored archive has."""
    return history_from_rows(run_rows(run_id=run_id))


def archive_summary() -> dict:
    """Per-tenant figures for operators (call inside the tenant's schema)."""
    figures = Archive.objects.aggregate(
        archived=Count("id", filter=Q(status=Archive.Status.ARCHIVED)),
        archived_bytes=Sum("size", filter=Q(status=Archive.Status.ARCHIVED), default=0),
        discarded=Count("id", filter=Q(status=Archive.Status.DISCARDED)),
        failing=Count("id", filter=Q(status=Archive.Status.FAILED)),
        last_archived_at=Max("archived_at"),
    )
    failure = (Archive.objects.filter(status=Archive.Status.FAILED).order_by("-updated_at")
               .values("run_id", "error", "updated_at", "attempts").first())
    return {**figures, "last_failure": failure}


def iter_lines(body: bytes) -> Iterator[dict]:
    for line in body.splitlines():
        if line:
            yield json.loads(line)
