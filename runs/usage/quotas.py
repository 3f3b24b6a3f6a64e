"""Quotas: a tenant's limits (its plan's, overridden by its own), how much of each it uses now,
and the checks at the point of use: run_start (concurrent runs, runs per day, tokens and cost per
month, hot-store bytes, sandbox CPU per day), the model call's budget check (tokens and cost per
month: the run parks for the owner) and the API throttle (requests per minute).

Use is read live from the tenant's rows for today (runs.usage.metering) plus the closed days'
UsageDay rows, so a check never waits for the beat task. Everything takes `now`: a test freezes
time by passing it."""

import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone
from django_tenants.utils import schema_context

from agentplatform.errors import ServiceError
from tenants.models import Tenant
from tenants.throttling import TenantPlanRateThrottle

from . import metering
from .models import QUOTA_FIELDS, Plan, TenantQuota, UsageDay

QUOTA_LABELS = {
    "concurrent_runs": "concurrent runs",
    "runs_per_day": "runs started per day",
    "tokens_per_month": "model tokens per month",
    "cost_usd_per_month": "model cost (USD) per month",
    "hot_bytes": "hot-store bytes",
    "sandbox_cpu_seconds_per_day": "sandbox CPU seconds per day",
    "api_requests_per_minute": "API requests per minute",
}


@dataclass(frozen=True)
class QuotaUse:
    """One quota this period: its limit (None: none), what is used, when the count resets
    (None: it does not, e.g. concurrent runs or stored bytes)."""

    name: str
    limit: float | None
    used: float
    resets_at: datetime | None

    @property
    def label(self) -> str:
        return QUOTA_LABELS.get(self.name, self.name)

    @property
    def exceeded(self) -> bool:
        return self.limit is not None and self.used >= self.limit

    @property
    def fraction(self) -> float | None:
        if self.limit is None:
            return None
        return 1.0 if self.limit <= 0 else min(1.0, float(self.used) / float(self.limit))

    def as_dict(self) -> dict:
        return {"quota": self.name, "limit": self.limit, "used": self.used,
                "resets_at": self.resets_at.isoformat() if self.resets_at else None}


class QuotaExceeded(ServiceError):
    """Over a quota: `fields` carries the quota's name, limit, current use and reset time."""

    def __init__(self, use: QuotaUse, *, now: datetime | None = None):
        reset = f"; it resets at {use.resets_at.isoformat()}" if use.resets_at else ""
        super().__init__("quota_exceeded", f"The tenant's quota of {use.label} is reached: "
                         f"{_number(use.used)} used of {_number(use.limit)}{reset}.")
        self.use = use
        self.fields = use.as_dict()
        # the API's Retry-After: until the count resets (none for a quota that does not)
        self.retry_after = None if use.resets_at is None else \
            (use.resets_at - (now or timezone.now())).total_seconds()


def _number(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def tenant_plan(*, tenant: Tenant) -> Plan | None:
    """The tenant's plan, or the default plan when it has none of its own (None: no plans)."""
    return _own_and_plan(tenant)[1]


def _own_and_plan(tenant: Tenant) -> tuple[TenantQuota | None, Plan | None]:
    own = TenantQuota.objects.filter(tenant_id=tenant.pk).select_related("plan").first()
    if own is not None and own.plan is not None:
        return own, own.plan
    return own, Plan.objects.filter(is_default=True).first()


def quota_limits(*, tenant: Tenant) -> dict[str, float | None]:
    """The tenant's seven limits: its override where set, else its plan's (or the default
    plan's), else none. Read fresh on every call (a start's check must see a limit set a moment
    ago), in one statement: the ORM's two queries were a fifth of a run's POST in CPU."""
    with connection.cursor() as cursor:
        cursor.execute(LIMITS_SQL, [tenant.pk])
        row = cursor.fetchone()
    return {name: None if value is None else float(value)
            for name, value in zip(QUOTA_FIELDS, row, strict=True)}


# Own override, else the own plan's (when the tenant has one, even where it is unset), else
# the default plan's: `tenant_plan` and `_own_and_plan` in SQL.
LIMITS_SQL = f"""
    SELECT {", ".join(
        f"coalesce(q.{name}, CASE WHEN p.id IS NOT NULL THEN p.{name} ELSE d.{name} END)"
        for name in QUOTA_FIELDS)}
      FROM (SELECT 1) one
      LEFT JOIN public.{TenantQuota._meta.db_table} q ON q.tenant_id = %s
      LEFT JOIN public.{Plan._meta.db_table} p ON p.id = q.plan_id
      LEFT JOIN public.{Plan._meta.db_table} d ON d.is_default"""


def _day_start(now: datetime) -> datetime:
    return now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


# A closed day's UsageDay row is final once computed this long after the day ended: a model
# call's transaction open at midnight commits a moment later, with its done_at before it.
FINAL_AFTER = timedelta(minutes=5)


def month_model_use(*, tenant: Tenant, now: datetime) -> tuple[int, Decimal]:
    """(tokens, cost) of the tenant's model calls this calendar month, up to now.

    A closed day counts its UsageDay row if that row was computed after the day ended (final);
    any other day (today, yesterday before the beat task recounted it, a day the task missed)
    is read live from the effects, or its row where that says more (retention pruned them)."""
    now = now.astimezone(UTC)
    month, today = metering.month_start(now), _day_start(now)
    rows = {row["day"]: row for row in UsageDay.objects.filter(
        tenant_id=tenant.pk, day__gte=month.date(), day__lte=today.date()).values(
        "day", "tokens_in", "tokens_out", "cost_usd", "computed_at")}
    live_from = month
    while live_from < today:  # the final days from the month's start: no need to read them
        row = rows.get(live_from.date())
        if row is None or row["computed_at"] < live_from + timedelta(days=1) + FINAL_AFTER:
            break
        live_from += timedelta(days=1)
    with schema_context(tenant.schema_name):
        live = metering.model_use_by_day(since=live_from, until=today + timedelta(days=1))
    tokens, cost = 0, Decimal(0)
    for day, row in rows.items():
        if day < live_from.date():
            tokens, cost = tokens + row["tokens_in"] + row["tokens_out"], cost + row["cost_usd"]
    day = live_from
    while day <= today:
        live_tokens, live_cost = live.get(day.date(), (0, Decimal(0)))
        row = rows.get(day.date())
        if row is not None and row["tokens_in"] + row["tokens_out"] > live_tokens:
            live_tokens, live_cost = row["tokens_in"] + row["tokens_out"], row["cost_usd"]
        tokens, cost = tokens + live_tokens, cost + live_cost
        day += timedelta(days=1)
    return tokens, cost


def quota_uses(*, tenant: Tenant, now: datetime | None = None,
               names: tuple[str, ...] = QUOTA_FIELDS,
               limits: dict[str, float | None] | None = None) -> list[QuotaUse]:
    """Each quota (of `names`) with its limit (from `limits`, if the caller read them), current
    use and reset time."""
    now = (now or timezone.now()).astimezone(UTC)
    limits = limits or quota_limits(tenant=tenant)
    today = _day_start(now)
    tomorrow = today + timedelta(days=1)
    uses = []
    with schema_context(tenant.schema_name):
        for name in names:
            limit = limits[name]
            if name == "concurrent_runs":
                uses.append(QuotaUse(name, limit, metering.runs_in_flight(), None))
            elif name == "runs_per_day":
                uses.append(QuotaUse(name, limit, metering.runs_started(since=today, until=tomorrow),
                                     tomorrow))
            elif name in ("tokens_per_month", "cost_usd_per_month"):
                tokens, cost = month_model_use(tenant=tenant, now=now)
                used = tokens if name == "tokens_per_month" else float(cost)
                uses.append(QuotaUse(name, limit, used, metering.next_month_start(now)))
            elif name == "hot_bytes":
                uses.append(QuotaUse(name, limit, metering.hot_bytes(), None))
            elif name == "sandbox_cpu_seconds_per_day":
                cpu, _ = metering.sandbox_seconds(since=today, until=tomorrow)
                uses.append(QuotaUse(name, limit, round(cpu, 3), tomorrow))
            elif name == "api_requests_per_minute":
                # the throttle's sliding window: it has no reset time, only a last minute
                counted = TenantPlanRateThrottle.requests_last_minute(tenant.schema_name)
                uses.append(QuotaUse(name, limit, counted or 0, None))
    return uses


# Checked before a run starts; the per-minute API rate is the throttle's.
START_QUOTAS = ("concurrent_runs", "runs_per_day", "tokens_per_month", "cost_usd_per_month",
                "hot_bytes", "sandbox_cpu_seconds_per_day")


def quota_check_start(*, tenant: Tenant | None = None, now: datetime | None = None) -> None:
    """Raise QuotaExceeded if the tenant may not start another run now. Only the quotas with a
    limit are measured (a tenant without limits pays nothing for this). Call it in the
    transaction that creates the run: the counted quotas are then checked under a lock."""
    tenant = tenant or _current_tenant()
    if tenant is None:
        return
    limits = quota_limits(tenant=tenant)
    names = tuple(name for name in START_QUOTAS if limits[name] is not None)
    if {"concurrent_runs", "runs_per_day"} & set(names) and connection.in_atomic_block:
        # Two starts checked at once would both find room for one: the tenant's starts are
        # checked one at a time, each until the transaction that creates its run commits.
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                           [f"quota-start:{tenant.schema_name}"])
    for use in quota_uses(tenant=tenant, now=now, names=names, limits=limits):
        if use.exceeded:
            raise QuotaExceeded(use, now=now)


def quota_check_model(*, tenant: Tenant | None = None, now: datetime | None = None) -> QuotaUse | None:
    """The monthly token or cost quota a model call would go over (it is reached), or None."""
    tenant = tenant or _current_tenant()
    if tenant is None:
        return None
    limits = quota_limits(tenant=tenant)
    names = tuple(n for n in ("tokens_per_month", "cost_usd_per_month") if limits[n] is not None)
    for use in quota_uses(tenant=tenant, now=now, names=names, limits=limits):
        if use.exceeded:
            return use
    return None


# The throttle's limit per tenant, read at most every QUOTA_RATE_CACHE_SECONDS per process
# (every API request asks for it): a changed limit applies at once in the process that made the
# change and within that many seconds in the others.
_rates: dict[int, tuple[float, int | None]] = {}


def api_rate_per_minute(*, tenant: Tenant) -> int | None:
    now = time.monotonic()
    cached = _rates.get(tenant.pk)
    if cached is not None and cached[0] > now:
        return cached[1]
    limit = quota_limits(tenant=tenant)["api_requests_per_minute"]
    rate = None if limit is None else int(limit)
    _rates[tenant.pk] = (now + settings.QUOTA_RATE_CACHE_SECONDS, rate)
    return rate


def quota_limits_changed(**_) -> None:
    """A plan or a tenant's quotas changed (a model signal): read the limits again, now and
    once the change commits (a request meanwhile would cache the limit it still sees)."""
    _rates.clear()
    transaction.on_commit(_rates.clear)


def _current_tenant() -> Tenant | None:
    """The tenant whose schema the connection is set to (None in public)."""
    schema = connection.schema_name
    if schema in ("", "public"):
        return None
    tenant = getattr(connection, "tenant", None)
    if isinstance(tenant, Tenant) and tenant.schema_name == schema:
        return tenant
    return Tenant.objects.filter(schema_name=schema).first()
