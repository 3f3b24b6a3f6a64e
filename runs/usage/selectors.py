"""Reading usage: a tenant's days (or months) for the API and the Usage page, this month's
totals, and its quotas against their use now (for the Usage page and the founders' console)."""

from dataclasses import dataclass
from datetime import date, datetime, timedelta
from decimal import Decimal

from django.utils import timezone
from django_tenants.utils import schema_context

from tenants.models import Tenant

from . import metering
from .models import UsageDay
from .quotas import QuotaUse, quota_uses

# A day's numbers, as the API gives them (models, effects and runs_finished are maps).
COUNTERS = ("runs_started", "steps", "active_seconds", "tokens_in", "tokens_out", "cost_usd",
            "sandbox_cpu_seconds", "sandbox_wall_seconds", "api_requests")
GAUGES = ("hot_bytes", "archive_bytes")  # a month's is its last day's
MAPS = ("runs_finished", "effects")

MAX_DAYS = 400  # a range the API answers at once


@dataclass
class UsagePeriod:
    """One day (`period` "2026-12-01") or month ("2026-12") of a tenant's use."""

    period: str
    start: date
    numbers: dict

    def as_dict(self) -> dict:
        return {"period": self.period, "start": self.start.isoformat(), **self.numbers}


def _empty() -> dict:
    numbers = {name: 0 for name in COUNTERS + GAUGES}
    numbers.update(active_seconds=0.0, cost_usd=Decimal(0), sandbox_cpu_seconds=0.0,
                   sandbox_wall_seconds=0.0, runs_finished={}, effects={}, models={})
    return numbers


def _numbers_of(row: UsageDay) -> dict:
    numbers = {name: getattr(row, name) for name in COUNTERS + GAUGES + MAPS}
    numbers["models"] = row.models_used
    return numbers


def _add(total: dict, numbers: dict) -> None:
    for name in COUNTERS:
        total[name] += numbers[name]
    for name in GAUGES:
        total[name] = numbers[name]
    for name in MAPS:
        for key, n in numbers[name].items():
            total[name][key] = total[name].get(key, 0) + n
    for model, use in numbers["models"].items():
        into = total["models"].setdefault(model, {"tokens_in": 0, "tokens_out": 0, "cost_usd": "0"})
        into["tokens_in"] += use["tokens_in"]
        into["tokens_out"] += use["tokens_out"]
        into["cost_usd"] = str(Decimal(into["cost_usd"]) + Decimal(use["cost_usd"]))


def usage_days(*, tenant: Tenant, since: date, until: date) -> list[UsagePeriod]:
    """Every day from `since` to `until` (inclusive), a day without a row counting zero."""
    rows = {row.day: row for row in UsageDay.objects.filter(tenant_id=tenant.pk, day__gte=since,
                                                            day__lte=until)}
    days = []
    # counted, not stepped past `until`: the day after 9999-12-31 does not exist (a 500)
    for offset in range((until - since).days + 1):
        day = since + timedelta(days=offset)
        numbers = _numbers_of(rows[day]) if day in rows else _empty()
        days.append(UsagePeriod(day.isoformat(), day, numbers))
    return days


def usage_months(*, tenant: Tenant, since: date, until: date) -> list[UsagePeriod]:
    """The days from `since` to `until` summed per calendar month (gauges: the last day's)."""
    months: dict[str, UsagePeriod] = {}
    for day in usage_days(tenant=tenant, since=since, until=until):
        key = day.start.strftime("%Y-%m")
        if key not in months:
            months[key] = UsagePeriod(key, day.start.replace(day=1), _empty())
        _add(months[key].numbers, day.numbers)
    return list(months.values())


def usage_month(*, tenant: Tenant, now: datetime | None = None) -> dict:
    """This calendar month's totals so far: the stored days, with today's counted live."""
    now = now or timezone.now()
    total = _empty()
    for day in usage_days(tenant=tenant, since=metering.month_start(now).date(),
                          until=now.date() - timedelta(days=1)):
        _add(total, day.numbers)
    with schema_context(tenant.schema_name):
        today = metering.day_use(day=now.date(), today=now.date())
    live = {
        "runs_started": today.runs_started, "steps": today.steps,
        "active_seconds": today.active_seconds, "tokens_in": today.model.tokens_in,
        "tokens_out": today.model.tokens_out, "cost_usd": today.model.cost_usd,
        "sandbox_cpu_seconds": today.sandbox_cpu_seconds,
        "sandbox_wall_seconds": today.sandbox_wall_seconds, "api_requests": 0,
        "hot_bytes": today.hot_bytes or 0, "archive_bytes": today.archive_bytes,
        "runs_finished": today.runs_finished, "effects": today.effects,
        "models": today.model.by_model}
    stored = UsageDay.objects.filter(tenant_id=tenant.pk, day=now.date()).first()
    if stored is not None:  # retention may have pruned today's rows since the last pass
        counted = _numbers_of(stored)
        for name in COUNTERS:
            live[name] = max(live[name], counted[name])
        for name in MAPS:
            live[name] = {key: max(live[name].get(key, 0), counted[name].get(key, 0))
                          for key in {*live[name], *counted[name]}}
        if counted["tokens_in"] + counted["tokens_out"] > today.model.tokens:
            live["models"] = counted["models"]
    _add(total, live)
    total["month"] = now.strftime("%Y-%m")
    return total


def usage_summary(*, tenant: Tenant, now: datetime | None = None) -> list[QuotaUse]:
    """Each of the tenant's quotas this period: limit (None: none), use now, reset time."""
    return quota_uses(tenant=tenant, now=now)
