"""The founders' console's reads across tenants: stuck runs (parked by the engine, or left with an
expired lease nobody took over), one tenant's overview (runs by status, archive state, usage
against quotas, last activity) and the fleet (workers, leases in flight, the ready list, outbox
backlog, due timers). A tenant's rows are read in its schema, one tenant at a time; a schema that
is missing or not migrated yet reads as empty rather than breaking the page."""

import logging
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.db.models import Count, Max, Min, OuterRef, Q, Subquery
from django.utils import timezone
from django_tenants.utils import schema_context

from runs.dispatch.models import ReadyRun, Wakeup, WorkerHeartbeat
from runs.effects.models import OutboxMessage
from runs.models import Branch, Run, RunEvent
from runs.retention.selectors import archive_summary
from runs.usage.selectors import usage_summary
from tenants.models import ApiKey, Tenant

log = logging.getLogger(__name__)

STUCK_KINDS = {
    "engine_error": "engine error",
    "version": "version mismatch",
    "poison_step": "poison step",
    "lease_expired": "expired lease",
}
# The last event a run parked by the engine has (runs.engine.claims.run_park_refused).
REFUSED_EVENTS = ("resume_refused", "poison_step")
# A fan-out branch the engine refused parks its run with this reason (engine/branches.py); other
# branches may record events after it, so the reason, not the last event, says so.
BRANCH_REFUSED = r"^fan_out: branch [0-9]+ refused: "
STUCK_LIMIT = 200  # per tenant and page


@dataclass(frozen=True)
class StuckRun:
    schema: str
    run_id: UUID
    agent: str
    agent_version: int
    status: str
    kind: str  # a key of STUCK_KINDS
    reason: str
    since: datetime

    @property
    def key(self) -> str:
        """How a console form names it: `<schema>:<run id>`."""
        return f"{self.schema}:{self.run_id}"

    @property
    def kind_label(self) -> str:
        return STUCK_KINDS[self.kind]


def lease_grace() -> timedelta:
    """How long past its expiry a lease counts as not taken over: a live fleet's watchdog hands
    the run to another worker within a tick or two, so one more lease period is generous."""
    return timedelta(seconds=settings.RUN_LEASE_SECONDS)


def stuck_runs_here(*, now: datetime | None = None, run_ids: Iterable[UUID] | None = None,
                    limit: int = STUCK_LIMIT) -> list[StuckRun]:
    """The stuck runs of the current tenant's schema, the longest stuck first: parked by an
    engine error, a version the code refuses, a poison step (their last event says so), or
    running on a lease that expired lease_grace() ago and no worker took over."""
    now = now or timezone.now()
    last_event = Subquery(RunEvent.objects.filter(run=OuterRef("pk")).order_by("-id")
                          .values("kind")[:1])
    runs = Run.objects.all()
    if run_ids is not None:
        runs = runs.filter(id__in=list(run_ids))
    # Only waiting runs get the subquery (one index probe each on (run, id)).
    parked = (runs.filter(status=Run.Status.WAITING).annotate(last_event=last_event)
              .filter(Q(last_event__in=REFUSED_EVENTS) | Q(waiting_reason__regex=BRANCH_REFUSED)))
    expired = runs.filter(status=Run.Status.RUNNING, lease_expires_at__lt=now - lease_grace())
    found = [_stuck(run, now) for run in parked.order_by("updated_at")[:limit]]
    found += [_stuck(run, now) for run in expired.order_by("lease_expires_at")[:limit]]
    return sorted(found, key=lambda s: s.since)[:limit]


def _stuck(run: Run, now: datetime) -> StuckRun:
    if run.status == Run.Status.RUNNING:
        ago = int((now - run.lease_expires_at).total_seconds())
        kind, reason = "lease_expired", (
            f"lease of {run.lease_owner} (epoch {run.lease_epoch}) expired {ago}s ago and no "
            "worker took it over")
        since = run.lease_expires_at
    else:
        reason, since = run.waiting_reason, run.updated_at
        if getattr(run, "last_event", "") == "poison_step" or reason.startswith("poison step"):
            kind = "poison_step"
        elif reason.startswith("engine error"):
            kind = "engine_error"
        else:  # unknown version, changed topology, a refused child run or branch
            kind = "version"
    return StuckRun(schema=connection.schema_name, run_id=run.id, agent=run.agent,
                    agent_version=run.agent_version, status=run.status, kind=kind,
                    reason=reason, since=since)


def in_schema(tenant: Tenant, read, default):
    """`read()` in the tenant's schema; `default` if the schema cannot be read (not provisioned,
    not migrated, being deleted)."""
    try:
        with schema_context(tenant.schema_name), transaction.atomic():
            return read()
    except DatabaseError:
        log.warning("console: cannot read schema %s", tenant.schema_name, exc_info=True)
        return default


def stuck_runs(*, tenants: Iterable[Tenant], now: datetime | None = None) -> list[StuckRun]:
    """The stuck runs of `tenants` (the ones the user may see), the longest stuck first."""
    now = now or timezone.now()
    found: list[StuckRun] = []
    for tenant in tenants:
        found += in_schema(tenant, lambda: stuck_runs_here(now=now), [])
    return sorted(found, key=lambda s: s.since)


@dataclass(frozen=True)
class QuotaLine:
    name: str
    limit: float | None
    used: float
    resets_at: datetime | None

    @property
    def share(self) -> float | None:
        return None if not self.limit else self.used / self.limit


def tenant_usage(*, tenant: Tenant) -> list[QuotaLine]:
    """This period's use against each quota (runs.usage.selectors.usage_summary)."""
    try:
        quotas = usage_summary(tenant=tenant)
    except DatabaseError:  # one tenant's figures must not take the tenant list down
        log.warning("console: no usage for %s", tenant.schema_name, exc_info=True)
        return []
    return [QuotaLine(name=q.name, limit=q.limit, used=q.used, resets_at=q.resets_at)
            for q in quotas]


def tenant_last_activity(*, tenant: Tenant) -> datetime | None:
    """When the tenant last did something: its newest run event, or an API key's last use."""
    def newest_event():
        return (RunEvent.objects.order_by("-id").values_list("created_at", flat=True).first())

    moments = [in_schema(tenant, newest_event, None),
               ApiKey.objects.filter(tenant=tenant).aggregate(at=Max("last_used_at"))["at"]]
    moments = [m for m in moments if m is not None]
    return max(moments) if moments else None


@dataclass
class TenantOverview:
    runs_by_status: dict[str, int]
    stuck: list[StuckRun]
    archive: dict[str, Any]
    usage: list[QuotaLine] | None
    last_activity: datetime | None
    readable: bool = True


def tenant_overview(*, tenant: Tenant, now: datetime | None = None) -> TenantOverview:
    """One tenant's page: its runs by status, its stuck runs, its archive state, usage."""
    now = now or timezone.now()

    def read():
        by_status = dict(Run.objects.order_by().values_list("status").annotate(n=Count("id")))
        return ({status: by_status.get(status, 0) for status in Run.Status.values},
                stuck_runs_here(now=now), archive_summary())

    found = in_schema(tenant, read, None)
    runs_by_status, stuck, archive = found or ({}, [], {})
    return TenantOverview(runs_by_status=runs_by_status, stuck=stuck, archive=archive,
                          usage=tenant_usage(tenant=tenant),
                          last_activity=tenant_last_activity(tenant=tenant),
                          readable=found is not None)


@dataclass
class WorkerLine:
    worker: str
    started_at: datetime | None
    beat_at: datetime | None
    leases_held: int  # at its last beat
    alive: bool
    runs: int = 0  # live run leases it holds now (read from the tenants' schemas)
    branches: int = 0


@dataclass
class TenantQueue:
    schema: str
    ready: int = 0  # in line, not handed out
    in_flight: int = 0  # handed to a worker
    deferred: int = 0  # handed back by workers without the run's agent version
    oldest_ready_at: datetime | None = None
    outbox_backlog: int = 0  # pending or being sent
    oldest_undelivered_at: datetime | None = None


@dataclass
class FleetSummary:
    workers: list[WorkerLine]
    queues: list[TenantQueue]
    oldest_ready: ReadyRun | None
    timers_due: int
    timers_total: int
    next_timer_at: datetime | None
    outbox_backlog: int = 0
    oldest_undelivered_at: datetime | None = None
    oldest_undelivered_schema: str = ""
    totals: dict[str, int] = field(default_factory=dict)


def heartbeat_alive_within() -> timedelta:
    """A worker that has not beaten for three heartbeats is taken for gone."""
    return timedelta(seconds=3 * settings.RUN_HEARTBEAT_SECONDS)


def fleet_summary(*, tenants: Iterable[Tenant], now: datetime | None = None) -> FleetSummary:
    """The fleet now: workers from their heartbeats (and from the live leases they hold in the
    tenants' schemas: a lease holder with no heartbeat row is listed too), the ready list per
    tenant, the oldest ready run, the outbox backlog per tenant, timers due."""
    now = now or timezone.now()
    tenants = list(tenants)
    schemas = {t.schema_name for t in tenants}
    alive_since = now - heartbeat_alive_within()
    workers = {w.worker: WorkerLine(worker=w.worker, started_at=w.started_at, beat_at=w.beat_at,
                                    leases_held=w.leases_held, alive=w.beat_at >= alive_since)
               for w in WorkerHeartbeat.objects.filter(beat_at__gte=now - timedelta(hours=1))}
    queues = {schema: TenantQueue(schema=schema) for schema in sorted(schemas)}
    for tenant in tenants:
        leases, outbox = in_schema(tenant, lambda: _schema_fleet(now), (Counter(), None))
        for (owner, table), n in leases.items():
            line = workers.setdefault(owner, WorkerLine(
                worker=owner, started_at=None, beat_at=None, leases_held=0, alive=False))
            if table == "run":
                line.runs += n
            else:
                line.branches += n
        if outbox is not None:
            queues[tenant.schema_name].outbox_backlog = outbox["n"]
            queues[tenant.schema_name].oldest_undelivered_at = outbox["oldest"]
    ready = ReadyRun.objects.filter(schema_name__in=schemas)
    for row in (ready.order_by().values("schema_name").annotate(
            ready=Count("id", filter=Q(dispatched_at=None, ready_at__lte=now)),
            in_flight=Count("id", filter=~Q(dispatched_at=None)),
            deferred=Count("id", filter=~Q(deferred_since=None)),
            oldest=Min("ready_at", filter=Q(dispatched_at=None, ready_at__lte=now)))):
        queue = queues[row["schema_name"]]
        queue.ready, queue.in_flight, queue.deferred = row["ready"], row["in_flight"], row["deferred"]
        queue.oldest_ready_at = row["oldest"]
    wakeups = Wakeup.objects.filter(schema_name__in=schemas)
    timers = wakeups.aggregate(due=Count("id", filter=Q(due_at__lte=now)), total=Count("id"),
                               next=Min("due_at", filter=Q(due_at__gt=now)))
    fleet = FleetSummary(
        workers=sorted(workers.values(), key=lambda w: (not w.alive, w.worker)),
        queues=list(queues.values()),
        oldest_ready=ready.filter(dispatched_at=None, ready_at__lte=now).order_by("ready_at").first(),
        timers_due=timers["due"], timers_total=timers["total"], next_timer_at=timers["next"])
    undelivered = [q for q in fleet.queues if q.oldest_undelivered_at is not None]
    fleet.outbox_backlog = sum(q.outbox_backlog for q in fleet.queues)
    if undelivered:
        oldest = min(undelivered, key=lambda q: q.oldest_undelivered_at)
        fleet.oldest_undelivered_at, fleet.oldest_undelivered_schema = (
            oldest.oldest_undelivered_at, oldest.schema)
    fleet.totals = {"alive": sum(w.alive for w in fleet.workers),
                    "runs": sum(w.runs for w in fleet.workers),
                    "branches": sum(w.branches for w in fleet.workers),
                    "ready": sum(q.ready for q in fleet.queues),
                    "in_flight": sum(q.in_flight for q in fleet.queues)}
    return fleet


def _schema_fleet(now: datetime) -> tuple[Counter, dict]:
    """In the current schema: live leases per (owner, "run" | "branch"), and the outbox backlog."""
    leases: Counter = Counter()
    for model, table in ((Run, "run"), (Branch, "branch")):
        rows = (model.objects.filter(status="running", lease_expires_at__gte=now).order_by()
                .values_list("lease_owner").annotate(n=Count("id")))
        for owner, n in rows:
            leases[(owner, table)] += n
    outbox = OutboxMessage.objects.filter(status__in=[OutboxMessage.Status.PENDING,
                                                      OutboxMessage.Status.SENDING]).aggregate(
        n=Count("id"), oldest=Min("created_at"))
    return leases, outbox


def stuck_keys_parse(keys: Iterable[str]) -> dict[str, list[UUID]]:
    """`<schema>:<run id>` values from a console form, by schema; malformed ones are dropped."""
    by_schema: dict[str, list[UUID]] = defaultdict(list)
    for key in keys:
        schema, _, run_id = str(key).partition(":")
        try:
            by_schema[schema].append(UUID(run_id))
        except ValueError:
            continue
    return dict(by_schema)
