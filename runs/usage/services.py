"""Metering's writes: each tenant's UsageDay rows recomputed from its own rows (idempotent:
computing a day twice writes the same numbers), and API request counts copied from Redis
(across a Redis restart too: see _api_requests_copy).

Counters only ever go up: retention prunes finished runs' rows (and their effects and sandbox
executions), so a recount of a closed day may find less than was there; the larger count wins.
Hot-store bytes are a gauge, measured for today only."""

from datetime import date, datetime, timedelta

from django.db import transaction
from django.utils import timezone
from django_tenants.utils import schema_context

from tenants.models import Tenant
from tenants.throttling import api_requests_read

from . import metering
from .models import UsageDay


def usage_day_refresh(*, tenant: Tenant, day: date, now: datetime | None = None) -> UsageDay:
    """Recompute the tenant's row for `day` (UTC) from its schema's rows and Redis' count."""
    now = now or timezone.now()
    today = now.date()
    with schema_context(tenant.schema_name):
        use = metering.day_use(day=day, today=today)
    # made empty first (two passes at once make one), then filled under its lock; as computed
    # at the day's start until then, so no reader takes it for a closed day's final count
    UsageDay.objects.get_or_create(tenant=tenant, day=day,
                                   defaults={"computed_at": metering.day_bounds(day)[0]})
    with transaction.atomic():
        row = UsageDay.objects.select_for_update().get(tenant=tenant, day=day)
        row.runs_started = max(row.runs_started, use.runs_started)
        row.runs_finished = _larger_counts(row.runs_finished, use.runs_finished)
        if use.steps >= row.steps:  # steps and seconds of one set of runs: kept together
            row.steps, row.active_seconds = use.steps, use.active_seconds
        if use.model.tokens >= row.tokens_in + row.tokens_out:
            row.tokens_in, row.tokens_out = use.model.tokens_in, use.model.tokens_out
            row.cost_usd, row.models_used = use.model.cost_usd, use.model.by_model
        row.effects = _larger_counts(row.effects, use.effects)
        if use.sandbox_wall_seconds >= row.sandbox_wall_seconds:
            row.sandbox_cpu_seconds = use.sandbox_cpu_seconds
            row.sandbox_wall_seconds = use.sandbox_wall_seconds
        if use.hot_bytes is not None:
            row.hot_bytes = use.hot_bytes
        row.archive_bytes = max(row.archive_bytes, use.archive_bytes)
        # read under the row's lock: two refreshes at once copy one reading after the other
        _api_requests_copy(row, api_requests_read(schema=tenant.schema_name, day=day))
        row.computed_at = now
        row.save()
    return row


def _api_requests_copy(row: UsageDay, read: tuple[str, int] | None) -> None:
    """Bring the row's API requests up to Redis' count. Within one Redis life the count only
    grows, so the row takes the larger reading; a new life (Redis restarted, its counts gone)
    counts from zero again, and what it counts is added to what the row already had."""
    if read is None:  # Redis out of reach: nothing new to copy
        return
    life, count = read
    if life and life == row.api_requests_life:
        seen = max(row.api_requests_seen, count)
        row.api_requests += seen - row.api_requests_seen
        row.api_requests_seen = seen
    elif life:
        row.api_requests += count
        row.api_requests_life, row.api_requests_seen = life, count


def _larger_counts(old: dict, new: dict) -> dict:
    return {key: max(old.get(key, 0), new.get(key, 0)) for key in sorted({*old, *new})}


def usage_refresh(*, tenant: Tenant, now: datetime | None = None) -> list[UsageDay]:
    """Today's and yesterday's rows (yesterday's last minutes were counted after it ended)."""
    now = now or timezone.now()
    return [usage_day_refresh(tenant=tenant, day=now.date() - timedelta(days=1), now=now),
            usage_day_refresh(tenant=tenant, day=now.date(), now=now)]
