"""`GET /api/v1/usage`: the calling tenant's days or months and its quotas; bad dates and
ranges are 400 invalid_filter naming the parameter; runs:read is enough, and another tenant's
usage is never in the answer."""

from datetime import timedelta

from django.utils import timezone
from django_tenants.utils import schema_context

from runs.usage.models import UsageDay
from runs.usage.selectors import usage_month, usage_summary
from runs.usage.services import usage_day_refresh
from tenants.models import Scope
from tenants.services import api_key_create
from tests.support.api import api_client
from tests.support.runs import finished, start


def test_usage_by_day_is_the_tenants_rows_with_every_day_in_the_range(acme, globex, acme_api):
    with schema_context("acme"):
        finished(start("research", input={"iterations": 1}).id)
    today = timezone.now().date()
    row = usage_day_refresh(tenant=acme, day=today)
    UsageDay.objects.update_or_create(tenant=globex, day=today, defaults={
        "runs_started": 999_999, "computed_at": timezone.now()})
    since = today - timedelta(days=2)
    answer = acme_api.get(f"/api/v1/usage?from={since}&to={today}")
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert body["from"] == since.isoformat() and body["to"] == today.isoformat()
    assert [p["period"] for p in body["periods"]] == [
        (since + timedelta(days=n)).isoformat() for n in range(3)]
    last = body["periods"][-1]
    assert last["runs_started"] == row.runs_started != 999_999
    assert last["steps"] == row.steps and last["cost_usd"] == f"{row.cost_usd:.6f}"
    assert {q["quota"] for q in body["quotas"]} >= {"runs_per_day", "tokens_per_month"}


def test_usage_by_month_sums_the_days(acme, acme_api):
    today = timezone.now().date()
    usage_day_refresh(tenant=acme, day=today)
    days = acme_api.get(f"/api/v1/usage?from={today.replace(day=1)}&to={today}").json()["periods"]
    [month] = acme_api.get(f"/api/v1/usage?from={today.replace(day=1)}&to={today}&group=month"
                           ).json()["periods"]
    assert month["period"] == today.strftime("%Y-%m")
    assert month["runs_started"] == sum(day["runs_started"] for day in days)
    assert month["tokens_in"] == sum(day["tokens_in"] for day in days)
    assert month["hot_bytes"] == days[-1]["hot_bytes"]


def test_bad_dates_and_ranges_are_400_naming_the_parameter(acme_api):
    for query, field in (("from=yesterday", "from"), ("to=2026-13-01", "to"),
                         ("group=week", "group"), ("from=2026-02-01&to=2026-01-01", "from"),
                         ("from=2020-01-01&to=2026-01-01", "to")):
        answer = acme_api.get(f"/api/v1/usage?{query}")
        assert answer.status_code == 400, (query, answer.content)
        error = answer.json()["error"]
        assert error["code"] == "invalid_filter" and field in error["fields"], (query, error)


def test_runs_read_is_enough_and_needed(acme):
    reader = api_key_create(tenant=acme, name="usage-reader", scopes=[Scope.RUNS_READ])[1]
    assert api_client(reader).get("/api/v1/usage").status_code == 200
    writer = api_key_create(tenant=acme, name="usage-writer", scopes=[Scope.EVENTS_WRITE])[1]
    assert api_client(writer).get("/api/v1/usage").json()["error"]["code"] == "insufficient_scope"


def test_usage_summary_and_month_for_the_console(acme, globex, quotas):
    quotas(acme, runs_per_day=10_000_000, tokens_per_month=10_000_000)  # the run below must start
    summary = {use.name: use for use in usage_summary(tenant=acme)}
    assert set(summary) == {"concurrent_runs", "runs_per_day", "tokens_per_month",
                            "cost_usd_per_month", "hot_bytes", "sandbox_cpu_seconds_per_day",
                            "api_requests_per_minute"}
    assert summary["runs_per_day"].limit == 10_000_000 and summary["tokens_per_month"].limit == 10_000_000
    assert summary["runs_per_day"].resets_at is not None and summary["hot_bytes"].used > 0
    assert {use.name: use.limit for use in usage_summary(tenant=globex)}["runs_per_day"] is None
    before = usage_month(tenant=acme)
    with schema_context("acme"):
        finished(start("research", input={"iterations": 1}).id)
    after = usage_month(tenant=acme)
    assert after["month"] == timezone.now().strftime("%Y-%m")
    assert after["runs_started"] == before["runs_started"] + 1
    assert after["runs_finished"]["succeeded"] == before["runs_finished"].get("succeeded", 0) + 1
