"""The Usage page: the tenant's use per day over the last weeks (runs, tokens, cost, hot and
archived bytes, as server-drawn SVG charts with the numbers in a table), this month's totals,
and its quotas against their use now. Every member may read it."""

from datetime import timedelta

from django.shortcuts import render
from django.urls import path
from django.utils import timezone

from runs.usage.selectors import usage_days, usage_month, usage_summary
from tenants.roles import READ

from ..access import tenant_page
from ..charts import Bar, bars_svg

DAYS_SHOWN = 30

# (id, title, unit, axis label, value of a day's numbers)
CHARTS = (
    ("runs", "Runs started per day", "count", "Runs", lambda n: n["runs_started"]),
    ("tokens", "Model tokens per day (in + out)", "count", "Tokens",
     lambda n: n["tokens_in"] + n["tokens_out"]),
    ("cost", "Model cost per day (USD)", "usd", "USD", lambda n: float(n["cost_usd"])),
    ("hot", "Hot-store size per day", "bytes", "Bytes", lambda n: n["hot_bytes"]),
    ("archive", "Archived size per day", "bytes", "Bytes", lambda n: n["archive_bytes"]),
)


@tenant_page(READ)
def usage_page(request, tenant):
    now = timezone.now()
    days = usage_days(tenant=request.member.tenant, since=now.date() - timedelta(days=DAYS_SHOWN - 1),
                      until=now.date())
    charts = [{"id": chart_id, "title": title,
               "svg": bars_svg(chart_id=f"chart-{chart_id}", title=title, unit=unit,
                               axis_label=axis, bars=[Bar(d.period, value(d.numbers)) for d in days])}
              for chart_id, title, unit, axis, value in CHARTS]
    quotas = usage_summary(tenant=request.member.tenant, now=now)
    return render(request, "dashboard/usage/index.html", {
        "section": "usage", "charts": charts, "days": days, "quotas": quotas,
        "month": usage_month(tenant=request.member.tenant, now=now), "days_shown": DAYS_SHOWN})


urlpatterns = [
    path("usage", usage_page, name="usage"),
]
