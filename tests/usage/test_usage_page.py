"""The dashboard's Usage page: any member reads it (charts drawn as SVG with titles and axis
labels, the numbers in a table, the quotas and how close they are); another tenant's member
gets 404, as for every tenant page."""

import re

from django.utils import timezone

from runs.usage.services import usage_day_refresh
from tests.dashboard.conftest import person, signed_in


def test_the_usage_page_shows_charts_table_and_quotas_to_a_member(acme, quotas):
    usage_day_refresh(tenant=acme, day=timezone.now().date())
    quotas(acme, runs_per_day=1_000_000)
    page = signed_in(person(acme, "viewer")).get("/t/acme/usage")
    assert page.status_code == 200
    html = page.content.decode()
    assert html.count('<svg xmlns="http://www.w3.org/2000/svg" class="chart"') == 5
    for title in ("Runs started per day", "Model tokens per day", "Model cost per day (USD)",
                  "Hot-store size per day", "Archived size per day"):
        assert f">{title}" in html
    assert 'role="img"' in html and "<desc id=" in html and "Day (UTC, month-day)" in html
    assert "<script" not in html.split("<main", 1)[1].split("</main>", 1)[0]
    assert "The charts&#x27; numbers, per UTC day" in html or "The charts' numbers" in html
    assert timezone.now().date().isoformat() in html
    assert re.search(r"runs started per day</th>\s*<td>[\d.]+</td>\s*<td>1000000</td>", html)
    assert 'aria-current="page">Usage</a>' in html


def test_the_usage_page_is_404_for_another_tenants_member(globex):
    outsider = signed_in(person(globex, "owner"))
    assert outsider.get("/t/acme/usage").status_code == 404
    assert outsider.get("/t/globex/usage").status_code == 200
