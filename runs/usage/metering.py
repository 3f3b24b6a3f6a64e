"""What a tenant's rows say it used between two instants: read inside the tenant's schema from
what the platform writes anyway (runs, effects with their model results, sandbox executions,
archive rows, the schema's relation sizes). Nothing here writes: metering adds no write to the
checkpoint's hot path. The daily rows are runs.usage.services'; quotas read these live."""

from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal

from django.db import connection
from django.db.models import Count, Q, Sum

from runs.effects.models import Effect
from runs.models import Run
from runs.retention.models import Archive
from sandboxes.models import SandboxExecution


def day_bounds(day: date) -> tuple[datetime, datetime]:
    """[start, end) of a UTC day."""
    start = datetime.combine(day, time.min, tzinfo=UTC)
    return start, start + timedelta(days=1)


def month_start(now: datetime) -> datetime:
    return datetime(now.year, now.month, 1, tzinfo=UTC)


def next_month_start(now: datetime) -> datetime:
    return datetime(now.year + (now.month == 12), now.month % 12 + 1, 1, tzinfo=UTC)


@dataclass
class ModelUse:
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: Decimal = Decimal(0)
    by_model: dict = field(default_factory=dict)

    @property
    def tokens(self) -> int:
        return self.tokens_in + self.tokens_out


# Model results carry {"model", "usage": {"prompt_tokens", "completion_tokens"}, "cost_usd"}
# (integrations/connectors/model.py); summed in SQL, by model, over effects done in the window.
_MODEL_USE = f"""
SELECT coalesce(result->>'model', args->>'model', '') AS model,
       coalesce(sum((result->'usage'->>'prompt_tokens')::bigint), 0),
       coalesce(sum((result->'usage'->>'completion_tokens')::bigint), 0),
       coalesce(sum((result->>'cost_usd')::numeric), 0)
  FROM {Effect._meta.db_table}
 WHERE connector = 'model' AND status = 'done' AND done_at >= %s AND done_at < %s
   AND jsonb_typeof(result->'usage') = 'object'
 GROUP BY 1
"""


USD_PLACES = Decimal("0.000001")


def model_use(*, since: datetime, until: datetime) -> ModelUse:
    """Tokens and cost of the model calls recorded done in [since, until), in this schema."""
    use = ModelUse()
    with connection.cursor() as cursor:
        cursor.execute(_MODEL_USE, [since, until])
        for model, tokens_in, tokens_out, cost in cursor.fetchall():
            cost = Decimal(cost)
            use.tokens_in += int(tokens_in)
            use.tokens_out += int(tokens_out)
            use.cost_usd += cost
            use.by_model[model] = {"tokens_in": int(tokens_in), "tokens_out": int(tokens_out),
                                   "cost_usd": str(cost)}
    use.cost_usd = use.cost_usd.quantize(USD_PLACES)  # as UsageDay.cost_usd keeps it
    return use


_MODEL_USE_BY_DAY = f"""
SELECT (done_at AT TIME ZONE 'UTC')::date,
       coalesce(sum((result->'usage'->>'prompt_tokens')::bigint), 0)
         + coalesce(sum((result->'usage'->>'completion_tokens')::bigint), 0),
       coalesce(sum((result->>'cost_usd')::numeric), 0)
  FROM {Effect._meta.db_table}
 WHERE connector = 'model' AND status = 'done' AND done_at >= %s AND done_at < %s
   AND jsonb_typeof(result->'usage') = 'object'
 GROUP BY 1
"""


def model_use_by_day(*, since: datetime, until: datetime) -> dict[date, tuple[int, Decimal]]:
    """{UTC day: (tokens, cost)} of the model calls recorded done in [since, until)."""
    with connection.cursor() as cursor:
        cursor.execute(_MODEL_USE_BY_DAY, [since, until])
        return {day: (int(tokens), Decimal(cost)) for day, tokens, cost in cursor.fetchall()}


def runs_started(*, since: datetime, until: datetime) -> int:
    """Runs created in the window (forks and child runs too: each is a run)."""
    return Run.objects.filter(created_at__gte=since, created_at__lt=until).count()


def runs_in_flight() -> int:
    """Runs that hold or wait for a worker: queued or running (a parked run holds nothing)."""
    return Run.objects.filter(status__in=[Run.Status.QUEUED, Run.Status.RUNNING]).count()


def sandbox_seconds(*, since: datetime, until: datetime) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of the sandboxed commands run in the window. CPU is the
    jail's cgroup measurement (cpu_ms) where the host accounts it, else its wall time: an
    upper bound for a jail held to one CPU or less (SANDBOX_CPUS)."""
    rows = SandboxExecution.objects.filter(created_at__gte=since, created_at__lt=until)
    totals = rows.aggregate(wall=Sum("duration_ms"), cpu=Sum("cpu_ms"),
                            unmeasured=Sum("duration_ms", filter=Q(cpu_ms__isnull=True)))
    wall = (totals["wall"] or 0.0) / 1000
    cpu = ((totals["cpu"] or 0.0) + (totals["unmeasured"] or 0.0)) / 1000
    return cpu, wall


def hot_bytes() -> int:
    """Bytes of every table of this tenant's schema (heap, indexes, TOAST)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relkind IN ('r', 'p', 'm')", [connection.schema_name])
        return int(cursor.fetchone()[0])


@dataclass
class DayUse:
    """What the tenant's rows say about one UTC day (see UsageDay for each field)."""

    runs_started: int = 0
    runs_finished: dict = field(default_factory=dict)
    steps: int = 0
    active_seconds: float = 0.0
    model: ModelUse = field(default_factory=ModelUse)
    effects: dict = field(default_factory=dict)
    sandbox_cpu_seconds: float = 0.0
    sandbox_wall_seconds: float = 0.0
    hot_bytes: int | None = None  # measured only for today: yesterday's size is gone
    archive_bytes: int = 0


def day_use(*, day: date, today: date) -> DayUse:
    """Aggregate one day from the current schema's rows. Steps and active seconds are a run's
    totals, counted on the day it finished (the engine keeps them per run, not per step)."""
    since, until = day_bounds(day)
    use = DayUse(runs_started=runs_started(since=since, until=until))
    finished = Run.objects.filter(finished_at__gte=since, finished_at__lt=until)
    for row in finished.values("status").annotate(n=Count("id"), steps=Sum("steps_taken"),
                                                  active=Sum("active_seconds")):
        use.runs_finished[row["status"]] = row["n"]
        use.steps += row["steps"] or 0
        use.active_seconds += row["active"] or 0.0
    use.model = model_use(since=since, until=until)
    for row in (Effect.objects.filter(status=Effect.Status.DONE, done_at__gte=since,
                                      done_at__lt=until)
                .values("connector").annotate(n=Count("id"))):
        use.effects[row["connector"]] = row["n"]
    use.sandbox_cpu_seconds, use.sandbox_wall_seconds = sandbox_seconds(since=since, until=until)
    if day == today:
        use.hot_bytes = hot_bytes()
    # The archive as it stood at the day's end: every object archived before it.
    use.archive_bytes = int(Archive.objects.filter(status=Archive.Status.ARCHIVED,
                                                   archived_at__lt=until)
                            .aggregate(n=Sum("size"))["n"] or 0)
    return use
