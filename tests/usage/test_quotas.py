"""Quotas: starting a run over a quota is 429 quota_exceeded naming the quota, its limit, the use
and when it resets (through the API and the dashboard alike, both call run_start); a reached
monthly token or cost quota parks a running run for the tenant's owner (approve: the run goes
on; reject: it fails); the API's per-minute rate is the plan's; counts reset on time (time is
frozen by passing `now`); and one tenant's use never counts against another's quota."""

from datetime import UTC, datetime, timedelta

import pytest
from django.core.cache import cache
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from django_tenants.utils import schema_context

from integrations.services import credential_set
from runs import engine
from runs.approvals.models import Approval
from runs.models import Run
from runs.services import run_start
from runs.usage import metering
from runs.usage import quotas as quota_module
from runs.usage.models import Plan, TenantQuota, UsageDay
from runs.usage.quotas import QuotaExceeded, month_model_use, quota_check_start, quota_limits, quota_uses
from tenants.throttling import TenantPlanRateThrottle
from tests.dashboard.conftest import person, signed_in
from tests.support.fakes.fixtures import fake_openai  # noqa: F401
from tests.support.runs import advanced, finished


def _use(tenant, name, now=None):
    [use] = quota_uses(tenant=tenant, now=now, names=(name,))
    return use


def test_a_tenant_gets_its_plans_limits_and_its_own_overrides_win(acme, quotas):
    plan = Plan.objects.create(name="test-small", runs_per_day=10, tokens_per_month=1000)
    quotas(acme, plan=plan, runs_per_day=3)
    limits = quota_limits(tenant=acme)
    assert limits["runs_per_day"] == 3 and limits["tokens_per_month"] == 1000
    assert limits["concurrent_runs"] is None


def test_the_default_plan_applies_to_a_tenant_without_one(acme, globex, quotas):
    Plan.objects.create(name="test-default", is_default=True, concurrent_runs=7)
    quotas(acme, runs_per_day=5)  # an override row without a plan: the default plan's rest
    assert quota_limits(tenant=acme)["concurrent_runs"] == 7
    assert quota_limits(tenant=globex)["concurrent_runs"] == 7


def test_runs_per_day_over_quota_is_429_with_the_quota_and_resets_at_midnight(
        acme, globex, acme_api, globex_api, quotas):
    used = _use(acme, "runs_per_day").used
    quotas(acme, runs_per_day=used + 1)
    first = acme_api.post("/api/v1/runs", {"agent": "research", "input": {"iterations": 1}},
                          format="json")
    assert first.status_code == 201, first.content
    refused = acme_api.post("/api/v1/runs", {"agent": "research", "input": {"iterations": 1}},
                            format="json")
    assert refused.status_code == 429, refused.content
    error = refused.json()["error"]
    assert error["code"] == "quota_exceeded"
    today = timezone.now().replace(hour=0, minute=0, second=0, microsecond=0)
    assert error["fields"] == {"quota": "runs_per_day", "limit": used + 1, "used": used + 1,
                               "resets_at": (today + timedelta(days=1)).isoformat()}
    assert "runs started per day" in error["message"]
    wait = (today + timedelta(days=1) - timezone.now()).total_seconds()
    assert abs(int(refused["Retry-After"]) - wait) <= 5
    # globex's runs are its own business
    assert globex_api.post("/api/v1/runs", {"agent": "research", "input": {"iterations": 1}},
                           format="json").status_code == 201
    # tomorrow the count starts again
    with schema_context("acme"):
        tomorrow = today + timedelta(days=1, minutes=1)
        quota_check_start(now=tomorrow)
        with pytest.raises(QuotaExceeded):
            quota_check_start(now=timezone.now())


def test_concurrent_runs_over_quota_refuse_a_start_until_one_ends(acme, quotas):
    with schema_context("acme"):
        started = [run_start(agent="research", input={"iterations": 1}, enqueue=False).run]
        for _ in range(20):  # earlier tests' runs may end between the count and the start
            quotas(acme, concurrent_runs=metering.runs_in_flight())
            try:
                started.append(run_start(agent="research", input={"iterations": 1},
                                         enqueue=False).run)
            except QuotaExceeded as exc:
                refused = exc
                break
        else:
            pytest.fail("a start at the quota was never refused")
        assert refused.fields["quota"] == "concurrent_runs"
        assert refused.fields["resets_at"] is None
        for run in started:
            finished(run.id)
        run_start(agent="research", input={"iterations": 1}, enqueue=False)  # room again


def test_the_dashboard_start_is_refused_over_quota_too(acme, quotas):
    client = signed_in(person(acme, "operator"))
    quotas(acme, runs_per_day=_use(acme, "runs_per_day").used)
    before = _use(acme, "runs_per_day").used
    page = client.post("/t/acme/runs/start", {"agent": "research", "version": "",
                                            "input": '{"iterations": 1}', "durability": "sync",
                                            "idempotency_key": "6d3b1a0e-0000-4000-8000-000000000001"})
    assert page.status_code == 200
    assert "quota of runs started per day is reached" in page.content.decode()
    assert _use(acme, "runs_per_day").used == before


def test_hot_bytes_and_sandbox_cpu_quotas_refuse_a_start(acme, quotas):
    quotas(acme, hot_bytes=1)
    with schema_context("acme"), pytest.raises(QuotaExceeded) as refused:
        run_start(agent="research", input={}, enqueue=False)
    assert refused.value.fields["quota"] == "hot_bytes" and refused.value.fields["used"] > 1
    quotas(acme, hot_bytes=None, sandbox_cpu_seconds_per_day=0)
    with schema_context("acme"), pytest.raises(QuotaExceeded) as refused:
        run_start(agent="research", input={}, enqueue=False)
    assert refused.value.fields["quota"] == "sandbox_cpu_seconds_per_day"


def _think(tenant_schema, fake_openai):  # noqa: F811
    credential_set(connector="model", secrets={"api_key": "sk-test",
                                               "base_url": fake_openai.url + "/v1"})
    return run_start(agent="worldly", enqueue=False,
                     input={"what": "think", "think_again": True, "max_tokens": 5}).run


@pytest.mark.parametrize("approve", [True, False])
def test_a_run_crossing_the_monthly_token_quota_parks_for_the_owner(acme, quotas, fake_openai,  # noqa: F811
                                                                   approve):
    owner = signed_in(person(acme, "owner"))
    viewer_like = signed_in(person(acme, "approver"))
    with schema_context("acme"):
        run = _think("acme", fake_openai)
        # room for what was used this month so far and nothing more: the first call crosses it
        tokens, _ = _month(acme)
        quotas(acme, tokens_per_month=tokens + 1)
        assert advanced(run.id) == engine.Outcome.PARKED
        approval = Approval.objects.get(run=run, kind="quota")
        assert approval.deciders == ["role:owner"]
        assert approval.request["quota"] == "tokens_per_month"
        assert fake_openai.requests == 1
    # an approver who is not an owner may not decide it
    refused = viewer_like.post(f"/t/acme/approvals/{approval.id}", {"decision": "approve"})
    assert refused.status_code == 409
    with schema_context("acme"):
        approval.refresh_from_db()
        assert approval.status == "pending"
    decided = owner.post(f"/t/acme/approvals/{approval.id}",
                         {"decision": "approve" if approve else "reject"})
    assert decided.status_code == 302, decided.content[:2000]
    with schema_context("acme"):
        approval.refresh_from_db()
        assert approval.status == ("approved" if approve else "rejected")
        if approve:
            done = finished(run.id)
            assert done.status == "succeeded" and fake_openai.requests == 2
        else:
            done = Run.objects.get(id=run.id)
            assert done.status == "failed" and "tokens_per_month" in done.error
            assert fake_openai.requests == 1


def _month(tenant, now=None):
    return month_model_use(tenant=tenant, now=now or timezone.now())


def test_the_monthly_quotas_reset_on_the_first_of_the_next_month(acme, quotas, fake_openai):  # noqa: F811
    with schema_context("acme"):
        finished(_think("acme", fake_openai).id)
    tokens, cost = _month(acme)
    quotas(acme, tokens_per_month=tokens, cost_usd_per_month=cost)
    now = timezone.now()
    use = _use(acme, "tokens_per_month", now)
    assert use.exceeded and use.resets_at == metering.next_month_start(now)
    next_month = metering.next_month_start(now) + timedelta(hours=1)
    assert not _use(acme, "tokens_per_month", next_month).exceeded
    assert not _use(acme, "cost_usd_per_month", next_month).exceeded
    with schema_context("acme"), pytest.raises(QuotaExceeded) as refused:
        run_start(agent="research", input={}, enqueue=False, now=now)
    assert refused.value.fields["quota"] in ("tokens_per_month", "cost_usd_per_month")
    with schema_context("acme"):
        run_start(agent="research", input={}, enqueue=False, now=next_month)


def test_month_boundaries_are_utc_calendar_months():
    assert metering.next_month_start(datetime(2026, 12, 31, 23, 59, tzinfo=UTC)) == \
        datetime(2027, 1, 1, tzinfo=UTC)
    assert metering.month_start(datetime(2026, 2, 14, tzinfo=UTC)) == datetime(2026, 2, 1, tzinfo=UTC)


def test_api_requests_per_minute_are_the_plans_and_only_the_tenants(acme, globex, acme_api,
                                                                     globex_api, quotas):
    cache.delete(TenantPlanRateThrottle.cache_key_for("acme"))
    quotas(acme, api_requests_per_minute=2)
    try:
        assert [acme_api.get("/api/v1/runs").status_code for _ in range(3)] == [200, 200, 429]
        throttled = acme_api.get("/api/v1/runs")
        assert throttled.json()["error"]["code"] == "throttled" and "Retry-After" in throttled
        assert globex_api.get("/api/v1/runs").status_code == 200
        assert _use(acme, "api_requests_per_minute").used == 2
        assert _use(acme, "api_requests_per_minute").limit == 2
    finally:
        cache.delete(TenantPlanRateThrottle.cache_key_for("acme"))


def test_the_throttle_reads_a_tenants_limits_once_and_again_when_they_change(acme, acme_api,
                                                                            quotas):
    def limit_reads() -> int:
        with CaptureQueriesContext(connection) as seen:
            assert acme_api.get("/api/v1/runs").status_code in (200, 429)
        return sum("usage_tenantquota" in q["sql"] or "usage_plan" in q["sql"]
                   for q in seen.captured_queries)

    cache.delete(TenantPlanRateThrottle.cache_key_for("acme"))
    quotas(acme, api_requests_per_minute=1000)
    try:
        assert limit_reads() >= 1  # a change reads them again
        assert [limit_reads() for _ in range(3)] == [0, 0, 0]
        quotas(acme, api_requests_per_minute=1)  # saved here: this process reads them again
        assert limit_reads() >= 1
        assert acme_api.get("/api/v1/runs").status_code == 429
    finally:
        cache.delete(TenantPlanRateThrottle.cache_key_for("acme"))


def test_a_start_reads_the_limits_fresh_in_one_statement(acme, quotas):
    def start_reading() -> int:
        with schema_context("acme"), CaptureQueriesContext(connection) as seen:
            run_start(agent="research", input={"iterations": 1}, enqueue=False)
        return sum("usage_tenantquota" in q["sql"] or "usage_plan" in q["sql"]
                   for q in seen.captured_queries)

    row = quotas(acme, runs_per_day=10_000)
    assert start_reading() == 1
    TenantQuota.objects.filter(pk=row.pk).update(runs_per_day=0)  # no signal: nothing to clear
    with schema_context("acme"), pytest.raises(QuotaExceeded) as refused:
        run_start(agent="research", input={"iterations": 1}, enqueue=False)
    assert refused.value.fields["quota"] == "runs_per_day"


def test_one_tenants_use_never_counts_against_anothers_quota(acme, globex, quotas):
    with schema_context("globex"):
        for _ in range(2):
            run_start(agent="research", input={}, enqueue=False)
    quotas(acme, runs_per_day=_use(acme, "runs_per_day").used + 1)
    with schema_context("acme"):
        run_start(agent="research", input={}, enqueue=False)
    assert _use(globex, "runs_per_day").limit is None


def test_a_closed_day_not_yet_recounted_after_midnight_still_counts_live(acme, quotas,
                                                                          fake_openai):  # noqa: F811
    """Just after midnight (or with the beat task stopped) yesterday's row was computed before
    the day ended: the month's use reads yesterday's calls live, not from that partial row."""
    with schema_context("acme"):
        finished(_think("acme", fake_openai).id)
    now = timezone.now()
    after_midnight = now.replace(hour=0, minute=1, second=0, microsecond=0) + timedelta(days=1)
    if after_midnight.month != now.month:
        pytest.skip("today is the month's last day: tomorrow is another month")
    tokens, cost = _month(acme, now)
    assert tokens > 0
    before = UsageDay.objects.filter(tenant=acme, day=now.date()).first()
    try:
        # the beat task's last count of today, before today's calls were all made
        UsageDay.objects.update_or_create(tenant=acme, day=now.date(), defaults={
            "tokens_in": 0, "tokens_out": 0, "cost_usd": 0, "computed_at": now})
        assert _month(acme, after_midnight) == (tokens, cost)
        # once recounted after the day ended, its row is what counts
        with schema_context("acme"):
            today_tokens = metering.model_use(since=now.replace(hour=0, minute=0, second=0,
                                                                microsecond=0),
                                              until=after_midnight).tokens
        UsageDay.objects.filter(tenant=acme, day=now.date()).update(
            tokens_in=today_tokens + 1000, computed_at=after_midnight + timedelta(minutes=10))
        assert _month(acme, after_midnight + timedelta(minutes=20))[0] == tokens + 1000
    finally:
        if before is None:
            UsageDay.objects.filter(tenant=acme, day=now.date()).delete()
        else:
            before.save()


def test_two_starts_at_once_never_both_take_the_last_concurrent_run(acme, quotas, monkeypatch):
    """Each start is checked and its run created one after the other: two requests racing for
    the last place get one run and one quota_exceeded, not two runs."""
    import threading

    from django.db import connection

    with schema_context("acme"):
        in_flight = metering.runs_in_flight()
    quotas(acme, concurrent_runs=in_flight + 1)
    both_checked = threading.Barrier(2)
    checked = quota_module.quota_check_start

    def check_then_wait(**kwargs):  # widen the window between the check and the insert
        checked(**kwargs)
        try:
            both_checked.wait(timeout=1)
        except threading.BrokenBarrierError:
            pass  # the other start waits for this one's commit: no race to widen

    monkeypatch.setattr("runs.services.quota_check_start", check_then_wait)
    outcomes, made = [], []

    def start():
        try:
            with schema_context("acme"):
                made.append(run_start(agent="research", input={"iterations": 1},
                                   enqueue=False).run.id)
            outcomes.append("started")
        except QuotaExceeded:
            outcomes.append("quota_exceeded")
        finally:
            connection.close()

    threads = [threading.Thread(target=start) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    try:
        assert sorted(outcomes) == ["quota_exceeded", "started"]
    finally:
        for run_id in made:
            with schema_context("acme"):
                finished(run_id)
