"""The outbox sweep finds its tenants in the due-index (public), not by looking into every
schema, and no message becomes due unseen while a sweep looks at its tenant."""

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone
from django_tenants.utils import tenant_context

from runs.dispatch.models import TenantDue
from runs.dispatch.services import due_mark, due_sweep
from runs.effects.models import OutboxMessage
from runs.effects.services import outbox_enqueue, outbox_sweep
from runs.services import run_start
from tests.support.runs import finished

OUTBOX = TenantDue.What.OUTBOX


@pytest.fixture
def no_beat(_session_beat):
    """The session's beat sweeps the outbox every half second: not during these tests."""
    _session_beat.stop()
    yield
    _session_beat.ensure()


def due_at(tenant):
    return TenantDue.objects.filter(schema_name=tenant.schema_name, what=OUTBOX) \
        .values_list("due_at", flat=True).first()


def test_an_enqueued_message_marks_its_tenant_due_in_the_same_transaction(in_acme, no_beat):
    run = run_start(agent="herald", enqueue=False, input={"url": "http://x.test/n"}).run
    TenantDue.objects.filter(schema_name="acme").update(due_at=None)
    with transaction.atomic():  # rolled back: nothing rings
        outbox_enqueue(run_id=run.id, name="due-index", connector="test_plain", args={})
        assert due_at(in_acme) <= timezone.now()
        transaction.set_rollback(True)
    assert due_at(in_acme) is None


def test_a_step_that_notifies_marks_its_tenant_due_in_its_checkpoint(in_acme, no_beat):
    TenantDue.objects.filter(schema_name="acme").update(due_at=None)
    run = run_start(agent="herald", enqueue=False, input={"url": "http://x.test/n", "notes": 1}).run
    try:
        assert finished(run.id).status == "succeeded"
        assert OutboxMessage.objects.filter(run=run).exists()
        assert due_at(in_acme) is not None and due_at(in_acme) <= timezone.now()
    finally:
        OutboxMessage.objects.filter(run=run).delete()


def test_a_step_that_notifies_marks_its_tenant_due_though_the_run_does_not_end_there(
        in_acme, no_beat):
    """The step's checkpoint marks the tenant, not the run's end: here the run stops at its
    step limit right after the notifying step, its end a statement of fields only."""
    TenantDue.objects.filter(schema_name="acme").update(due_at=None)
    run = run_start(agent="herald", enqueue=False, max_steps=1,
                    input={"url": "http://x.test/n", "notes": 3}).run
    try:
        assert finished(run.id).status == "failed"  # max_steps reached after the first note
        assert OutboxMessage.objects.filter(run=run).count() == 1
        assert due_at(in_acme) is not None and due_at(in_acme) <= timezone.now()
    finally:
        OutboxMessage.objects.filter(run=run).delete()


def test_a_run_that_notifies_nothing_marks_nothing_due(in_acme, no_beat):
    TenantDue.objects.filter(schema_name="acme").update(due_at=None)
    run = run_start(agent="chatter", enqueue=False, input={"steps": 2}).run
    assert finished(run.id).status == "succeeded"
    assert due_at(in_acme) is None


def test_the_sweep_visits_only_the_tenants_the_due_index_names(acme, globex, no_beat):
    tomorrow = timezone.now() + timedelta(days=1)
    with tenant_context(globex):
        due_mark(what=OUTBOX, at=tomorrow)  # a retry due tomorrow: not looked at today
    with tenant_context(acme):
        due_mark(what=OUTBOX)
    connection.set_schema_to_public()
    visited = []

    def visit():
        visited.append(connection.schema_name)
        return None

    assert due_sweep(what=OUTBOX, visit=visit) >= 1
    assert "acme" in visited and "globex" not in visited
    assert due_at(acme) is None and due_at(globex) <= tomorrow


def test_sweep_leaves_a_tenant_due_while_it_has_a_due_message_and_moves_it_to_the_next_one(
        acme, no_beat):
    with tenant_context(acme):
        run = run_start(agent="herald", enqueue=False, input={"url": "http://x.test/n"}).run
        due = OutboxMessage.objects.create(
            run=run, name="due-now", connector="test_plain", args={},
            idempotency_key=f"due-{run.id.hex[:20]}", next_attempt_at=timezone.now())
    connection.set_schema_to_public()
    later = timezone.now() + timedelta(hours=1)
    try:
        with transaction.atomic():  # rolled back: the deliverer it rings is never sent
            with tenant_context(acme):
                # acme's other messages (earlier tests' retries) due after this one's claim
                OutboxMessage.objects.exclude(id=due.id).filter(
                    status__in=["pending", "sending"]).update(
                    next_attempt_at=later + timedelta(hours=1),
                    claimed_until=later + timedelta(hours=1))
                due_mark(what=OUTBOX)
            outbox_sweep()
            assert due_at(acme) <= timezone.now()  # rung; rung again next sweep if still due
            with tenant_context(acme):
                OutboxMessage.objects.filter(id=due.id).update(
                    status="sending", claimed_by="w:1", claimed_until=later)
            outbox_sweep()
            assert due_at(acme) == later  # its claim may expire then: looked at again
            transaction.set_rollback(True)
    finally:
        with tenant_context(acme):
            OutboxMessage.objects.filter(id=due.id).delete()


def test_a_message_made_due_while_the_sweep_looks_at_its_tenant_is_not_lost(acme, no_beat):
    with tenant_context(acme):
        due_mark(what=OUTBOX)
    connection.set_schema_to_public()
    marked = threading.Event()

    def mark():  # another transaction makes a message due, committing after the sweep looked
        try:
            with tenant_context(acme), transaction.atomic():
                due_mark(what=OUTBOX)
            marked.set()
        finally:
            connection.close()

    marker = threading.Thread(target=mark)

    def visit():  # the sweep holds the row and sees nothing due: it will clear the row
        if connection.schema_name != "acme":
            return None
        marker.start()
        time.sleep(0.5)
        assert not marked.is_set(), "the mark must wait for the row the sweep holds"
        return None

    assert due_sweep(what=OUTBOX, visit=visit) >= 1
    marker.join(timeout=10)
    assert marked.is_set()
    assert due_at(acme) is not None and due_at(acme) <= timezone.now()


def test_a_tenant_being_marked_is_skipped_by_the_sweep_and_stays_due(acme, no_beat):
    with tenant_context(acme):
        due_mark(what=OUTBOX)
    connection.set_schema_to_public()
    holding, release = threading.Event(), threading.Event()

    def mark():
        try:
            with tenant_context(acme), transaction.atomic():
                due_mark(what=OUTBOX)
                holding.set()
                release.wait(10)
        finally:
            connection.close()

    marker = threading.Thread(target=mark)
    marker.start()
    try:
        assert holding.wait(10)
        visited = []
        due_sweep(what=OUTBOX, visit=lambda: visited.append(connection.schema_name))
        assert "acme" not in visited
    finally:
        release.set()
        marker.join(timeout=10)
    assert due_at(acme) <= timezone.now()
