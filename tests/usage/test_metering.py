"""Metering: a tenant's UsageDay rows say what its runs did (runs, steps, tokens per model,
effects per connector, sandbox seconds, API requests), recomputing is idempotent, a closed day
never goes down when retention prunes what it was counted from, and one tenant's runs never
show in another's usage."""

from datetime import timedelta
from decimal import Decimal

from django.db import connection, transaction
from django.utils import timezone
from django_tenants.utils import schema_context

from integrations.services import credential_set
from runs.effects.models import Effect
from runs.models import Run
from runs.usage import metering
from runs.usage.models import UsageDay
from runs.usage.services import usage_day_refresh, usage_refresh
from runs.usage.tasks import refresh_all_tenants
from sandboxes.models import SandboxExecution
from tenants.throttling import api_request_count, api_requests_key
from tests.support.fakes.fixtures import fake_openai  # noqa: F401
from tests.support.runs import finished, start
from tests.support.waiting import wait_for


def _today(tenant):
    with schema_context(tenant.schema_name):
        return metering.day_use(day=timezone.now().date(), today=timezone.now().date())


def test_usage_rows_match_what_the_runs_did(acme, globex, fake_openai, s3):  # noqa: F811
    before, globex_before = _today(acme), _today(globex)
    with schema_context("acme"):
        credential_set(connector="model", secrets={"api_key": "sk-test",
                                                   "base_url": fake_openai.url + "/v1"})
        thinker = finished(start("worldly", input={"what": "think", "think_again": True}).id)
        sandboxed = finished(start("sandboxed", input={"steps": [["echo one"], ["echo two"]]}).id)
        research = finished(start("research", input={"iterations": 2}).id)
        runs = [thinker, sandboxed, research]
        assert [run.status for run in runs] == ["succeeded"] * 3, [run.error for run in runs]
        model_rows = list(Effect.objects.filter(run=thinker, connector="model"))
        sandbox_rows = list(SandboxExecution.objects.filter(run=sandboxed))
    after = _today(acme)

    assert after.runs_started - before.runs_started == 3
    assert after.runs_finished["succeeded"] - before.runs_finished.get("succeeded", 0) == 3
    assert after.steps - before.steps == sum(run.steps_taken for run in runs)
    assert after.active_seconds - before.active_seconds > 0
    prompt = sum(row.result["usage"]["prompt_tokens"] for row in model_rows)
    completion = sum(row.result["usage"]["completion_tokens"] for row in model_rows)
    assert len(model_rows) == 2 and prompt == fake_openai.prompt_tokens
    assert after.model.tokens_in - before.model.tokens_in == prompt
    assert after.model.tokens_out - before.model.tokens_out == completion
    assert after.model.tokens - before.model.tokens == thinker.tokens_used
    was = before.model.by_model.get("gpt-test", {"tokens_in": 0, "cost_usd": "0"})
    assert after.model.by_model["gpt-test"]["tokens_in"] - was["tokens_in"] == prompt
    assert Decimal(after.model.by_model["gpt-test"]["cost_usd"]) - Decimal(was["cost_usd"]) \
        == thinker.cost_usd
    assert after.effects["model"] - before.effects.get("model", 0) == 2
    assert len(sandbox_rows) == 2
    wall = sum(row.duration_ms for row in sandbox_rows) / 1000
    assert abs((after.sandbox_wall_seconds - before.sandbox_wall_seconds) - wall) < 1e-6
    cpu = sum(row.duration_ms if row.cpu_ms is None else row.cpu_ms for row in sandbox_rows) / 1000
    assert abs((after.sandbox_cpu_seconds - before.sandbox_cpu_seconds) - cpu) < 1e-6
    assert after.hot_bytes > 0
    # globex saw none of it
    globex_after = _today(globex)
    assert globex_after.runs_started == globex_before.runs_started
    assert globex_after.model.tokens == globex_before.model.tokens

    row = usage_day_refresh(tenant=acme, day=timezone.now().date())
    assert row.runs_started == after.runs_started and row.steps == after.steps
    assert row.tokens_in == after.model.tokens_in and row.cost_usd == after.model.cost_usd
    assert row.effects == after.effects and row.hot_bytes > 0


def test_recomputing_a_day_is_idempotent_and_the_beat_task_does_every_tenant(acme, globex):
    with schema_context("acme"):
        finished(start("research", input={"iterations": 1}).id)
    assert {"acme", "globex"} <= set(refresh_all_tenants())
    first = UsageDay.objects.get(tenant=acme, day=timezone.now().date())
    again = usage_day_refresh(tenant=acme, day=timezone.now().date())
    fields = ("runs_started", "runs_finished", "steps", "tokens_in", "tokens_out", "cost_usd",
              "effects", "sandbox_wall_seconds", "archive_bytes")
    assert {f: getattr(first, f) for f in fields} == {f: getattr(again, f) for f in fields}
    assert UsageDay.objects.filter(tenant=acme, day=timezone.now().date()).count() == 1
    assert UsageDay.objects.filter(tenant=globex, day=timezone.now().date()).exists()
    assert len(usage_refresh(tenant=acme)) == 2  # today and yesterday


def test_a_closed_day_is_not_recomputed_down_when_its_runs_are_pruned(acme):
    yesterday = timezone.now().date() - timedelta(days=1)
    with schema_context("acme"):
        run = finished(start("research", input={"iterations": 1}).id)
        # as if it had started and ended yesterday
        Run.objects.filter(id=run.id).update(created_at=timezone.now() - timedelta(days=1),
                                             finished_at=timezone.now() - timedelta(days=1))
    counted = usage_day_refresh(tenant=acme, day=yesterday)
    assert counted.runs_started >= 1 and counted.steps >= run.steps_taken
    with schema_context("acme"), transaction.atomic():  # what retention's prune does
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL agentplatform.allow_prune = 'on'")
        Run.objects.filter(id=run.id).delete()
    recounted = usage_day_refresh(tenant=acme, day=yesterday)
    assert recounted.runs_started == counted.runs_started
    assert recounted.runs_finished == counted.runs_finished
    assert recounted.steps == counted.steps


def test_api_requests_are_counted_per_tenant_and_flushed(acme, globex, acme_api, globex_api):
    day = timezone.now().date()
    before = usage_day_refresh(tenant=acme, day=day).api_requests
    globex_before = usage_day_refresh(tenant=globex, day=day).api_requests
    for _ in range(3):
        assert acme_api.get("/api/v1/runs").status_code == 200
    assert usage_day_refresh(tenant=acme, day=day).api_requests - before == 3
    assert usage_day_refresh(tenant=globex, day=day).api_requests == globex_before


def test_api_requests_counted_after_a_redis_restart_add_to_those_already_copied(acme):
    """A Redis restarted empty counts the day from zero again: what it counts after the restart
    is added to what the usage task had copied, not lost until the new count passes the old
    one. Copying one reading twice adds nothing."""
    from django.core.cache import cache

    day = timezone.now().date()
    before = usage_day_refresh(tenant=acme, day=day).api_requests
    for _ in range(5):
        api_request_count(schema="acme")
    assert usage_day_refresh(tenant=acme, day=day).api_requests == before + 5
    assert usage_day_refresh(tenant=acme, day=day).api_requests == before + 5
    cache.delete(api_requests_key("acme", day))  # what a restart without persistence leaves
    for _ in range(2):
        api_request_count(schema="acme")
    assert usage_day_refresh(tenant=acme, day=day).api_requests == before + 7
    assert usage_day_refresh(tenant=acme, day=day).api_requests == before + 7


def test_a_worker_runs_the_metering_pass_for_every_tenant(acme, globex, worker):
    started = timezone.now()
    refresh_all_tenants.delay()
    today = timezone.now().date()
    wait_for(lambda: UsageDay.objects.filter(tenant__in=[acme, globex], day=today,
                                             computed_at__gte=started).count() == 2,
             timeout=60, what="a worker to recompute acme's and globex's usage")
