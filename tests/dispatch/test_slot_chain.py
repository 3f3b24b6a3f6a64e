"""A worker whose run leaves runs the run that refills its slot itself: the fair pick made in
the leaving run's transaction is kept by that worker, which switches to the picked run's tenant
and runs it in the same task, with no message through the broker (runs.tasks.advance).

A real worker process (one slot) and two fresh tenants; no beat, and no other worker, so the
only messages are the ones the test and the worker send."""

import re
import time
import uuid
from datetime import timedelta

import pytest
import redis
from django.conf import settings
from django.db import connection
from django.db.models import F
from django_tenants.utils import tenant_context

from runs.dispatch.models import ReadyRun
from runs.dispatch.services import dispatch_ready, ready_mark
from runs.models import Run
from runs.services import run_start
from tenants.models import Tenant
from tenants.services import tenant_create, tenant_delete
from tests.conftest import Worker
from tests.support.waiting import wait_for

pytestmark = pytest.mark.usefixtures("no_beat", "own_workers", "celery_queue_clean")
ASIDE = timedelta(days=365 * 100)


@pytest.fixture
def two_tenants(s3):
    """Two tenants of their own, each with at most one run in flight."""
    tag = uuid.uuid4().hex[:8]
    made = [tenant_create(schema_name=f"chain{tag}{side}").tenant for side in "ab"]
    Tenant.objects.filter(pk__in=[t.pk for t in made]).update(max_in_flight=1)
    try:
        yield made
    finally:
        connection.set_schema_to_public()
        for tenant in made:
            tenant_delete(tenant=tenant)


@pytest.fixture
def line_of_its_own(two_tenants):
    """Earlier tests' runs still in line (nothing hands them out with no beat) are set aside,
    far in the future, so that the picks are among this test's runs only; put back after."""
    ours = [t.schema_name for t in two_tenants]
    aside = list(ReadyRun.objects.filter(dispatched_at__isnull=True)
                 .exclude(schema_name__in=ours).values_list("id", flat=True))
    ReadyRun.objects.filter(id__in=aside).update(ready_at=_shifted(ASIDE))
    yield
    ReadyRun.objects.filter(id__in=aside).update(ready_at=_shifted(-ASIDE))


def _shifted(by: timedelta):
    return F("ready_at") + by


def _queued(tenant: Tenant, agent: str = "chatter") -> Run:
    """A run put in line (its own transaction: a later `ready_at` than the one before)."""
    with tenant_context(tenant):
        run = run_start(agent=agent, input={"steps": 2}, enqueue=False).run
        ready_mark(run_id=run.id)
    time.sleep(0.002)
    return run


def _started(tenant: Tenant, runs: list[Run], timeout: float = 60) -> list:
    """When each of `runs` was first claimed, once all of them succeeded."""
    with tenant_context(tenant):
        ids = [run.id for run in runs]
        wait_for(lambda: Run.objects.filter(id__in=ids, status="succeeded").count() == len(ids),
                 timeout=timeout, what=f"{len(ids)} runs of {tenant.schema_name} to succeed")
        return [Run.objects.get(id=run_id).started_at for run_id in ids]


def _received(worker) -> int:
    """How many runs.advance messages the worker took from the broker."""
    return len(re.findall(r"Task runs\.advance\[[^\]]+\] received", worker.log_path.read_text()))


def _dispatched_now(count: int) -> None:
    """Hand out exactly `count` runs (the oldest in fair order), whatever earlier tests left
    counted as in flight."""
    in_flight = ReadyRun.objects.filter(dispatched_at__isnull=False).count()
    assert dispatch_ready(budget=in_flight + count) == count


@pytest.fixture
def one_slot():
    """One worker process with one slot, and slices long enough that only a run's end frees
    it; the dispatcher's global budget out of the way (the tenants' caps decide). What earlier
    tests left in the runs' queue (the stopped beat's ticks, messages of their runs, which
    the watchdog hands out again) is dropped first: the test counts what waits there."""
    redis.Redis.from_url(settings.CELERY_BROKER_URL).delete(settings.CELERY_TASK_DEFAULT_QUEUE)
    worker = Worker("chain", 1, env={"DISPATCH_MAX_IN_FLIGHT": "100000",
                                     "RUN_SLICE_SECONDS": "30"})
    yield worker
    worker.stop()


def test_a_freed_slot_runs_the_next_pick_in_its_worker_across_tenants_with_one_message(
        two_tenants, line_of_its_own, one_slot):
    first, second = two_tenants
    a1 = _queued(first)
    b1, b2 = _queued(second), _queued(second)  # the second tenant's cap (1) holds b2 back
    _dispatched_now(1)  # a1: one message
    assert ReadyRun.objects.get(run_id=a1.id).dispatched_at is not None
    one_slot.wait_ready()
    # a1's end picked b1 (the first tenant had nothing left), b1's end b2: each run by the
    # worker that freed the slot, in the second tenant's schema, with no message of its own
    (a1_at,), (b1_at, b2_at) = _started(first, [a1]), _started(second, [b1, b2])
    assert a1_at < b1_at < b2_at
    assert _received(one_slot) == 1, one_slot.log_tail()
    assert not ReadyRun.objects.filter(run_id__in=[a1.id, b1.id, b2.id]).exists()


def test_a_message_waiting_in_the_broker_goes_before_the_pick_the_worker_kept(
        two_tenants, line_of_its_own, one_slot):
    """The first tenant's a2 is picked when a1 ends, but the second tenant's b1, handed out
    before it, waits in the broker for this worker's slot: a2 is rung behind it, not run
    first; a2's end then keeps a3 (nothing waits any more)."""
    first, second = two_tenants
    a1 = _queued(first)
    b1 = _queued(second)
    a2, a3 = _queued(first), _queued(first)
    _dispatched_now(2)  # a1 and b1, in that order
    one_slot.wait_ready()
    (b1_at,), (a1_at, a2_at, a3_at) = _started(second, [b1]), _started(first, [a1, a2, a3])
    assert a1_at < b1_at < a2_at < a3_at
    assert _received(one_slot) == 3, one_slot.log_tail()  # a1, b1, a2; a3 kept
