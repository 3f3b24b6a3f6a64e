"""Lock order: deciding, delivering events, cancelling and firing timers on the same parked runs
at once, from many threads, lets no deadlock escape and leaves each run in one consistent state."""

import random
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

from django.db import connection
from django.utils import timezone
from django_tenants.utils import tenant_context

from runs import engine
from runs.approvals.models import Approval, EventGate
from runs.approvals.services import approval_decide, event_deliver
from runs.dispatch.models import ReadyRun, Wakeup
from runs.dispatch.services import wakeups_fire
from runs.models import Run, RunEvent
from runs.services import RunError, run_cancel, run_start
from tests.support.runs import advanced
from tests.support.waiting import wait_for

RESUMES = ("approval_decided", "event_received", "wait_timed_out")
RUNS_PER_KIND = 15


def test_deciding_delivering_cancelling_and_firing_at_once_never_deadlocks(acme):
    with tenant_context(acme):
        runs = []
        for i in range(RUNS_PER_KIND * 2):
            how = "approval" if i % 2 else "event"
            run = run_start(agent="waiter", enqueue=False, input={
                "how": how, "kind": "lock.order", "key": f"k-{uuid.uuid4()}",
                "timeout": 3600}).run
            assert advanced(run.id) == engine.Outcome.PARKED
            runs.append(run)
        approvals = {a.run_id: a.id for a in Approval.objects.filter(run__in=runs)}
        # Every timeout is due now too: the timer races the person, the event and the cancel.
        Wakeup.objects.filter(run_id__in=[r.id for r in runs]).update(
            due_at=timezone.now() - timedelta(seconds=1))

    def in_acme(action):
        def act():
            try:
                with tenant_context(acme):
                    action()
            except RunError as exc:  # refused as stale: the run moved on, which is fine
                return exc.code
            finally:
                connection.close()
            return "done"
        return act

    def fire():
        try:
            return wakeups_fire()
        finally:
            connection.close()

    actions = []
    for run in runs:
        if run.id in approvals:
            actions.append(in_acme(lambda a=approvals[run.id]: approval_decide(
                approval_id=a, approve=True, by="api:default")))
        else:
            actions.append(in_acme(lambda r=run: event_deliver(
                kind="lock.order", key=r.input["key"], payload={"ok": True},
                source_id=f"lock-{r.id}")))
        actions.append(in_acme(lambda r=run: run_cancel(run_id=r.id)))
        actions.append(fire)
    random.Random(11).shuffle(actions)
    with ThreadPoolExecutor(max_workers=12) as pool:
        outcomes = [f.result() for f in [pool.submit(a) for a in actions]]  # raises what escaped
    refusals = {o for o in outcomes if isinstance(o, str)} - {"done"}
    assert refusals <= {"run_finished", "run_not_waiting", "approval_closed"}, outcomes

    with tenant_context(acme):
        for run in runs:
            def ended(run=run):
                engine.advance(run_id=run.id, sleep=lambda s: None)
                current = Run.objects.get(id=run.id)
                return current if current.is_finished else None

            final = wait_for(ended, timeout=60, what=f"run {run.id} to end")
            events = list(RunEvent.objects.filter(run=run).values_list("kind", flat=True))
            resumes = sum(kind in RESUMES for kind in events)
            assert not Approval.objects.filter(run=run, status="pending").exists()
            assert not EventGate.objects.filter(run=run, status="open").exists()
            assert not Wakeup.objects.filter(run_id=run.id).exists()
            assert not ReadyRun.objects.filter(run_id=run.id).exists()
            if final.status == "cancelled":
                assert resumes <= 1 and events.count("run_cancelled") == 1, events
            else:
                assert final.status == "succeeded" and resumes == 1, (final.status, events)
