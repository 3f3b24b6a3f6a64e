"""Ways around a quota that must not work: starts racing at the limit (each counted after the
ones before it commit), a fork (a new run, admitted as a start is), and the usage API's range
at the calendar's end (a clear 400, not a 500)."""

import threading

import pytest
from django.db import connection, connections, transaction
from django_tenants.utils import schema_context

from runs.services import run_cancel, run_fork, run_start
from runs.usage import metering
from runs.usage.quotas import QuotaExceeded, quota_uses
from tests.support.runs import finished
from tests.support.waiting import wait_for


def _used(tenant, name):
    [use] = quota_uses(tenant=tenant, names=(name,))
    return use.used


def _blocked_on_advisory_lock() -> bool:
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                       "AND wait_event = 'advisory' AND datname = current_database()")
        return cursor.fetchone()[0] > 0


def test_starts_racing_at_the_concurrent_limit_do_not_both_get_in(acme, quotas):
    """The first start has measured and created its run, not yet committed; the second start
    must wait for it and then see it (before: both measured one free place and both got in)."""
    with schema_context("acme"):
        quotas(acme, concurrent_runs=metering.runs_in_flight() + 1)
    first_in, second_done, outcome = threading.Event(), threading.Event(), {}

    def first():
        with schema_context("acme"), transaction.atomic():
            outcome["first"] = run_start(agent="research", input={}, enqueue=False).run.id
            first_in.set()
            wait_for(lambda: second_done.is_set() or _blocked_on_advisory_lock(), timeout=20,
                     what="the second start to wait or to finish")
        connections.close_all()

    def second():
        try:
            with schema_context("acme"):
                outcome["second"] = run_start(agent="research", input={}, enqueue=False).run.id
        except QuotaExceeded as exc:
            outcome["refused"] = exc.fields["quota"]
        finally:
            second_done.set()
            connections.close_all()

    a = threading.Thread(target=first)
    a.start()
    assert first_in.wait(20)
    b = threading.Thread(target=second)
    b.start()
    a.join(30)
    b.join(30)
    connection.set_schema_to_public()
    with schema_context("acme"):
        for key in ("first", "second"):
            if key in outcome:
                run_cancel(run_id=outcome[key])
    assert "second" not in outcome, "two starts raced past a limit of one more run"
    assert outcome["refused"] == "concurrent_runs"


def test_a_fork_is_refused_over_the_runs_per_day_quota(acme, acme_api, quotas):
    with schema_context("acme"):
        source = finished(run_start(agent="research", input={"iterations": 1},
                                    enqueue=False).run.id)
        assert source.is_finished
    quotas(acme, runs_per_day=_used(acme, "runs_per_day"))
    before = _used(acme, "runs_per_day")
    with schema_context("acme"), pytest.raises(QuotaExceeded) as refused:
        run_fork(run_id=source.id, visit=0, enqueue=False)
    assert refused.value.fields["quota"] == "runs_per_day"
    answer = acme_api.post(f"/api/v1/runs/{source.id}/fork", {"visit": 0}, format="json")
    assert answer.status_code == 429, answer.content
    assert answer.json()["error"]["code"] == "quota_exceeded"
    assert _used(acme, "runs_per_day") == before


def test_the_usage_api_at_the_end_of_the_calendar_is_an_answer_not_a_500(acme_api):
    answer = acme_api.get("/api/v1/usage", {"from": "9999-12-30", "to": "9999-12-31"})
    assert answer.status_code in (200, 400), answer.content
    month = acme_api.get("/api/v1/usage", {"to": "9999-12-31", "group": "month"})
    assert month.status_code in (200, 400), month.content
