"""The founders' console: tenants with usage and activity, a tenant's page, stuck runs across
tenants (each kind, made by in-process runs) with confirmed and audited actions, and the fleet.
Logged-in staff through Django's test client; real tenants acme and globex."""

import re
import socket
import time
import uuid
from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone
from django_tenants.utils import tenant_context

from runs import engine
from runs.console import selectors as console
from runs.console import services as console_services
from runs.dispatch.models import ReadyRun, Wakeup, WorkerHeartbeat
from runs.dispatch.services import ready_mark
from runs.effects.models import OutboxMessage
from runs.engine import claims
from runs.leases import leases, worker_id
from runs.models import Run
from runs.services import RunError, run_cancel, run_requeue
from runs.usage.models import Plan, TenantQuota
from tenants.models import ApiKey, AuditEntry, ConsoleAccess, Tenant
from tests.support import rollout_v2_agents  # noqa: F401  (rollout v2 has "work"; v3 renamed it)
from tests.support.runs import advanced, start
from tests.support.waiting import wait_for
from tests.tenants.test_console_access import logged_in

PAGES = ("/admin/console/stuckruns/", "/admin/console/fleet/", "/admin/tenants/tenant/")

# The runs made here are stuck or in line on purpose: no beat may hand them to a worker.
pytestmark = pytest.mark.usefixtures("no_beat")


def engine_error_run():
    run = start("chatter", input={"steps": 2})

    def broken(self):
        raise RuntimeError("the platform tripped")

    original = claims.Harness.go
    claims.Harness.go = broken
    try:
        assert advanced(run.id) == engine.Outcome.PARKED
    finally:
        claims.Harness.go = original
    return run


def version_mismatch_run():
    run = start("rollout", version=1)
    Run.objects.filter(id=run.id).update(topology_hash="0" * 64)  # its steps changed under it
    assert advanced(run.id) == engine.Outcome.PARKED
    return run


def poison_run():
    run = start("chatter", input={"steps": 2})
    for _ in range(settings.RUN_MAX_CLAIMS_WITHOUT_CHECKPOINT):  # each claimer died in the step
        assert engine.run_claim(run_id=run.id, owner="doomed", lease_seconds=-1)
    assert advanced(run.id) == engine.Outcome.PARKED
    return run


def expired_lease_run():
    run = start("chatter", input={"steps": 2})
    # claimed by a worker that died, its lease long expired, and no ready row for the watchdog
    assert engine.run_claim(run_id=run.id, owner="gone-host:4242",
                            lease_seconds=-(3 * settings.RUN_LEASE_SECONDS))
    return run


def settle(tenant, *runs):
    """Leave nothing stuck for the next test: every run ends (cancelled, unless a worker ends
    a requeued one first)."""
    with tenant_context(tenant):
        for run in runs:
            run = Run.objects.get(id=run.id)
            if run.status == Run.Status.RUNNING:
                run_requeue(run_id=run.id, by="test")
            try:
                run_cancel(run_id=run.id, by="test")
            except RunError:  # a requeued run a session worker took and ended meanwhile
                if not Run.objects.get(id=run.id).is_finished:
                    raise


@pytest.fixture
def stuck(acme, globex):
    """One stuck run of each kind: three in acme, the expired lease in globex."""
    with tenant_context(acme):
        made = {"engine_error": engine_error_run(), "version": version_mismatch_run(),
                "poison_step": poison_run()}
    with tenant_context(globex):
        made["lease_expired"] = expired_lease_run()
    yield made
    settle(acme, *(made[k] for k in ("engine_error", "version", "poison_step")))
    settle(globex, made["lease_expired"])


def test_console_pages_load_for_a_superuser_and_are_refused_to_staff_without_permission(acme):
    founder, _ = logged_in(superuser=True)
    for page in (*PAGES, f"/admin/tenants/tenant/{acme.pk}/change/"):
        assert founder.get(page).status_code == 200, page
    index = founder.get("/admin/").content.decode()
    assert "/admin/console/stuckruns/" in index and "/admin/console/fleet/" in index

    staff, _ = logged_in()  # staff, no permission at all
    for page in (*PAGES, f"/admin/tenants/tenant/{acme.pk}/change/"):
        assert staff.get(page).status_code == 403, page
    assert staff.post("/admin/console/stuckruns/confirm/", {"action": "cancel"}).status_code == 403
    assert "/admin/console/" not in staff.get("/admin/").content.decode()

    reader, _ = logged_in(permissions=("view_stuckruns", "view_fleet"))
    assert reader.get("/admin/console/stuckruns/").status_code == 200
    assert reader.get("/admin/console/fleet/").status_code == 200
    # seeing stuck runs is not acting on them: that is the change permission
    assert 'name="action"' not in reader.get("/admin/console/stuckruns/").content.decode()
    assert reader.post("/admin/console/stuckruns/confirm/",
                       {"action": "cancel"}).status_code == 403


def test_stuck_runs_of_every_kind_and_tenant_are_listed_with_their_reason(stuck, acme, globex):
    with tenant_context(acme):
        normal = start("chatter")  # queued: not stuck
    try:
        founder, user = logged_in(superuser=True)
        page = founder.get("/admin/console/stuckruns/").content.decode()
        for kind, run in stuck.items():
            assert str(run.id) in page, kind
        assert str(normal.id) not in page
        assert "engine error: RuntimeError: the platform tripped" in page
        assert "changed its steps since this run started" in page
        assert "poison step" in page
        assert "lease of gone-host:4242" in page and "no worker took it over" in page

        found = {s.run_id: s for s in console.stuck_runs(tenants=[acme, globex])}
        assert {kind: found[run.id].kind for kind, run in stuck.items()} == {
            kind: kind for kind in stuck}
        assert found[stuck["lease_expired"].id].schema == "globex"

        link = f"/admin/runs/run/tenant/globex/?run={stuck['lease_expired'].id}"
        assert f'href="{link}"' in page  # into the run's own page, its tenant chosen
        opened = founder.get(link, follow=True)
        assert opened.redirect_chain[-1][0] == f"/admin/runs/run/{stuck['lease_expired'].id}/change/"
        assert "gone-host:4242" in opened.content.decode()

        only = founder.get("/admin/console/stuckruns/?kind=poison_step").content.decode()
        assert str(stuck["poison_step"].id) in only and str(stuck["version"].id) not in only

        shown = set(ConsoleAccess.objects.filter(user_id=user.pk, view="stuck_list")
                    .values_list("tenant_schema", "run_id"))
        assert ("globex", stuck["lease_expired"].id) in shown
        assert ("acme", stuck["poison_step"].id) in shown
    finally:
        settle(acme, normal)


def test_requeue_is_confirmed_with_its_count_then_done_and_audited_in_both_logs(stuck):
    chosen = [stuck["poison_step"], stuck["lease_expired"]]
    keys = [f"acme:{chosen[0].id}", f"globex:{chosen[1].id}", f"globex:{uuid.uuid4()}"]
    founder, user = logged_in(permissions=("view_stuckruns", "change_stuckruns"))

    confirm = founder.post("/admin/console/stuckruns/confirm/",
                           {"action": "requeue", "run": keys})
    body = confirm.content.decode()
    assert confirm.status_code == 200 and "re-queue</strong> 2 stuck run(s)" in body
    assert "1 of the runs you selected are not stuck any more" in body
    with tenant_context(Tenant.objects.get(schema_name="acme")):
        assert Run.objects.get(id=chosen[0].id).status == "waiting"  # nothing done yet

    done = founder.post("/admin/console/stuckruns/confirm/",
                        {"action": "requeue", "run": keys[:2], "confirmed": "yes"}, follow=True)
    assert "Re-queue: 2 run(s) done, 0 refused." in done.content.decode()
    with tenant_context(Tenant.objects.get(schema_name="acme")):
        run = Run.objects.get(id=chosen[0].id)
        # back in line (a worker this session started may already have taken it on)
        assert run.status != "waiting" and run.claims_without_checkpoint <= 1
    with tenant_context(Tenant.objects.get(schema_name="globex")):
        run = Run.objects.get(id=chosen[1].id)
        assert run.lease_owner != "gone-host:4242", (run.status, run.lease_owner)  # not the dead one

    logged = set(ConsoleAccess.objects.filter(user_id=user.pk, view="stuck_action:requeue")
                 .values_list("tenant_schema", "run_id"))
    assert logged == {("acme", chosen[0].id), ("globex", chosen[1].id)}
    audit = set(AuditEntry.objects.filter(actor=f"admin:{user.username}")
                .values_list("tenant__schema_name", "action", "target"))
    assert audit == {("acme", "run.requeued", f"run:{chosen[0].id}"),
                     ("globex", "run.requeued", f"run:{chosen[1].id}")}
    entry = AuditEntry.objects.get(actor=f"admin:{user.username}", tenant__schema_name="acme")
    assert entry.detail == {"via": "console", "stuck": "poison_step"}

    # a second confirm of the same runs: they are not stuck any more, so nothing is done
    again = founder.post("/admin/console/stuckruns/confirm/",
                         {"action": "cancel", "run": keys[:2], "confirmed": "yes"}, follow=True)
    assert "Cancel: 0 run(s) done, 2 refused." in again.content.decode()
    assert AuditEntry.objects.filter(actor=f"admin:{user.username}").count() == 2


def test_a_run_a_worker_took_over_after_the_page_was_read_is_left_to_that_worker(
        globex, monkeypatch):
    """The founder's re-queue is decided under the run's lock: a worker that claimed the
    expired run between the stuck check and the action keeps it, its lease not fenced off."""
    with tenant_context(globex):
        run = expired_lease_run()
    founder, user = logged_in(superuser=True)
    read_stuck = console_services.stuck_runs_here
    calls = []

    def then_taken_over(**kwargs):
        found = read_stuck(**kwargs)
        if not calls:  # a live worker takes the run over just after the first look
            assert engine.run_claim(run_id=run.id, owner="live-host:1", lease_seconds=60)
        calls.append(kwargs)
        return found

    monkeypatch.setattr(console_services, "stuck_runs_here", then_taken_over)
    try:
        report = console_services.stuck_runs_act(user=user, tenant=globex, action="requeue",
                                                 run_ids=[run.id], path="/test")
        assert report.done == [] and len(report.refused) == 1
        with tenant_context(globex):
            taken = Run.objects.get(id=run.id)
            assert (taken.status, taken.lease_owner) == ("running", "live-host:1")
    finally:
        settle(globex, run)


def test_cancelling_a_run_whose_lease_expired_ends_it_now(globex):
    """No worker holds a stuck run's expired lease to see a cancel request at a step's end:
    the run is cancelled at once, its last holder fenced off."""
    with tenant_context(globex):
        run = expired_lease_run()
        epoch = Run.objects.get(id=run.id).lease_epoch
        try:
            cancelled = run_cancel(run_id=run.id, by="test")
            assert cancelled.status == "cancelled" and cancelled.lease_epoch == epoch + 1
        finally:
            settle(globex, run)


def test_migrate_moves_a_version_mismatch_to_the_newest_version_that_has_its_step(stuck, acme):
    run = stuck["version"]
    founder, user = logged_in(superuser=True)
    founder.post("/admin/console/stuckruns/confirm/",
                 {"action": "migrate", "run": [f"acme:{run.id}", f"acme:{stuck['engine_error'].id}"],
                  "confirmed": "yes"})
    with tenant_context(acme):
        migrated = Run.objects.get(id=run.id)
        # back in line on v2 (a worker this session started may already have taken it on)
        assert migrated.agent_version == 2 and migrated.status != "waiting", migrated.status
        assert Run.objects.get(id=stuck["engine_error"].id).status == "waiting"  # chatter: no v2
    entry = AuditEntry.objects.get(actor=f"admin:{user.username}", action="run.migrated")
    assert entry.detail["from_version"] == 1 and entry.detail["to_version"] == 2

    founder.post("/admin/console/stuckruns/confirm/",
                 {"action": "cancel", "run": [f"acme:{stuck['engine_error'].id}"],
                  "confirmed": "yes"})
    with tenant_context(acme):
        assert Run.objects.get(id=stuck["engine_error"].id).status == "cancelled"


def test_a_superusers_only_tenants_stuck_runs_stay_hidden_and_untouched(stuck, globex):
    Tenant.objects.filter(pk=globex.pk).update(superusers_only=True)
    try:
        staff, _ = logged_in(permissions=("view_stuckruns", "change_stuckruns", "view_tenant",
                                          "change_tenant"))
        page = staff.get("/admin/console/stuckruns/").content.decode()
        assert str(stuck["lease_expired"].id) not in page and str(stuck["poison_step"].id) in page
        staff.post("/admin/console/stuckruns/confirm/", {
            "action": "requeue", "run": [f"globex:{stuck['lease_expired'].id}"], "confirmed": "yes"})
        with tenant_context(globex):
            assert Run.objects.get(id=stuck["lease_expired"].id).status == "running"
        tenant_page = staff.get(f"/admin/tenants/tenant/{globex.pk}/change/").content.decode()
        assert "tenant-console" not in tenant_page
    finally:
        Tenant.objects.filter(pk=globex.pk).update(superusers_only=False)


def test_tenant_list_shows_plan_members_usage_against_quotas_and_last_activity(acme):
    with tenant_context(acme):
        run = start("chatter")  # before the plan: its one run a day is then used up
    plan = Plan.objects.create(name=f"starter-{uuid.uuid4().hex[:6]}", runs_per_day=1)
    TenantQuota.objects.update_or_create(tenant=acme, defaults={"plan": plan})
    try:
        founder, _ = logged_in(superuser=True)
        page = founder.get("/admin/tenants/tenant/").content.decode()
        assert plan.name in page
        assert re.search(r"⚠ runs_per_day: [0-9.kM]+ / 1<", page), "the day's runs, of one allowed"
        assert re.search(r"tokens_per_month: [0-9.kM]+ / ∞", page)
        for column in ("column-plan", "column-members", "column-usage_this_month",
                       "column-last_activity"):
            assert column in page
        assert console.tenant_last_activity(tenant=acme) >= run.created_at
        detail = founder.get(f"/admin/tenants/tenant/{acme.pk}/change/").content.decode()
        assert "tenant-usage" in detail and "runs_per_day" in detail
    finally:
        TenantQuota.objects.filter(tenant=acme).delete()
        plan.delete()
        settle(acme, run)


def test_a_tenants_page_shows_its_runs_by_status_stuck_runs_and_archive_state(stuck, acme):
    founder, user = logged_in(superuser=True)
    page = founder.get(f"/admin/tenants/tenant/{acme.pk}/change/").content.decode()
    assert 'id="runs-by-status"' in page and 'id="tenant-archive"' in page
    assert str(stuck["poison_step"].id) in page and str(stuck["lease_expired"].id) not in page
    overview = console.tenant_overview(tenant=acme)
    assert overview.runs_by_status["waiting"] >= 3 and set(overview.runs_by_status) == set(
        Run.Status.values)
    assert {"archived", "failing", "last_archived_at"} <= set(overview.archive)
    assert ConsoleAccess.objects.filter(user_id=user.pk, view="tenant_page",
                                        run_id=stuck["poison_step"].id).exists()


def test_suspend_and_reactivate_go_to_both_audit_logs(globex):
    founder, user = logged_in(permissions=("view_tenant", "change_tenant"))
    try:
        founder.post("/admin/tenants/tenant/", {"action": "suspend", "_selected_action": [globex.pk]})
        assert Tenant.objects.get(pk=globex.pk).status == "suspended"
        founder.post("/admin/tenants/tenant/", {"action": "reactivate",
                                                "_selected_action": [globex.pk]})
        assert Tenant.objects.get(pk=globex.pk).status == "active"
    finally:
        Tenant.objects.filter(pk=globex.pk).update(status="active")
    assert list(ConsoleAccess.objects.filter(user_id=user.pk).order_by("at")
                .values_list("view", "tenant_schema")) == [
        ("tenant_action:suspend", "globex"), ("tenant_action:reactivate", "globex")]
    assert list(AuditEntry.objects.filter(actor=f"admin:{user.username}").order_by("id")
                .values_list("action", "detail")) == [
        ("tenant.suspended", {"via": "console", "status_before": "active", "status": "suspended"}),
        ("tenant.reactivated", {"via": "console", "status_before": "suspended",
                                "status": "active"})]


def test_fleet_shows_workers_leases_ready_list_outbox_and_timers(acme, globex):
    leases.worker_beat()  # this process, as its heartbeat thread writes it
    WorkerHeartbeat.objects.update_or_create(worker="dead-host:1", defaults={
        "started_at": timezone.now() - timedelta(minutes=30),
        "beat_at": timezone.now() - timedelta(minutes=5)})
    with tenant_context(acme):
        held = start("chatter")
        assert engine.run_claim(run_id=held.id, owner=worker_id(), lease_seconds=600)  # live
        waiting = start("chatter")
        ready_mark(run_id=waiting.id)  # in line, never handed out (no dispatch)
        ReadyRun.objects.filter(run_id=waiting.id).update(
            ready_at=timezone.now() - timedelta(hours=2))
    with tenant_context(globex):
        sender = start("chatter")
        message = OutboxMessage.objects.create(
            run=sender, name="notify", connector="webhook", args={}, idempotency_key=uuid.uuid4().hex,
            next_attempt_at=timezone.now() + timedelta(days=1))
    timer = Wakeup.objects.create(tenant=globex, schema_name="globex", run_id=sender.id, visit=0,
                                  due_at=timezone.now() - timedelta(seconds=5))
    try:
        fleet = console.fleet_summary(tenants=[acme, globex])
        workers = {w.worker: w for w in fleet.workers}
        assert workers[worker_id()].alive and workers[worker_id()].runs >= 1
        assert not workers["dead-host:1"].alive
        queues = {q.schema: q for q in fleet.queues}
        assert queues["acme"].ready >= 1
        assert fleet.oldest_ready.run_id == waiting.id
        assert queues["globex"].outbox_backlog >= 1 and queues["globex"].oldest_undelivered_at
        assert fleet.timers_due >= 1

        founder, _ = logged_in(superuser=True)
        page = founder.get("/admin/console/fleet/").content.decode()
        assert worker_id() in page and "dead-host:1" in page and str(waiting.id) in page
        assert 'id="outbox-backlog"' in page and 'id="timers"' in page
    finally:
        timer.delete()
        with tenant_context(globex):
            message.delete()
        WorkerHeartbeat.objects.filter(worker="dead-host:1").delete()
        with tenant_context(acme):
            ReadyRun.objects.filter(run_id=waiting.id).delete()
        settle(acme, held, waiting)
        settle(globex, sender)


def test_a_heartbeat_row_is_one_upsert_of_a_few_milliseconds_per_beat():
    leases.worker_beat()
    beats = 200
    began = time.perf_counter()
    for _ in range(beats):
        leases.worker_beat()
    each = (time.perf_counter() - began) / beats
    print(f"heartbeat row upsert: {each * 1000:.2f} ms per beat")
    assert each < 0.02  # one small upsert per process every RUN_HEARTBEAT_SECONDS
    row = WorkerHeartbeat.objects.get(worker=worker_id())
    assert row.beat_at >= timezone.now() - timedelta(seconds=5) and row.started_at <= row.beat_at


def test_a_locked_heartbeat_table_holds_the_lease_thread_up_for_a_second_at_most():
    """The row is written on the lease thread, after the extensions: a heartbeat table locked
    by someone else (a migration, a long prune) gives up the row, never the next extension."""
    import threading

    from django.db import OperationalError, connection, transaction
    locked, done = threading.Event(), threading.Event()

    def lock_the_table():
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(f"LOCK TABLE {WorkerHeartbeat._meta.db_table} "
                               "IN ACCESS EXCLUSIVE MODE")
                locked.set()
                done.wait(timeout=6)
        finally:
            connection.close()

    holder = threading.Thread(target=lock_the_table)
    holder.start()
    try:
        assert locked.wait(timeout=10)
        began = time.perf_counter()
        with pytest.raises(OperationalError):  # lock_timeout: the row is given up this beat
            leases.worker_beat()
        assert time.perf_counter() - began < 3
    finally:
        done.set()
        holder.join(timeout=10)
    leases.worker_beat()  # the next beat writes it again




def test_a_worker_is_alive_on_the_fleet_page_from_its_start_and_gone_once_stopped(acme,
                                                                                 start_worker):
    process = start_worker("fleet", concurrency=2)
    host = socket.gethostname()
    pool = {f"{host}:{pid}" for pid in process.pids() - {process.process.pid}}

    def alive() -> set[str]:
        return {w.worker for w in console.fleet_summary(tenants=[acme]).workers if w.alive}

    # idle, it has run nothing: its pool processes beat from their start
    wait_for(lambda: len(pool) == 2 and pool <= alive(), timeout=30, interval=0.2,
             what="the new worker's pool processes to beat")
    founder, _ = logged_in(superuser=True)
    page = founder.get("/admin/console/fleet/").content.decode()
    assert all(name in page for name in pool)

    process.stop()
    wait_for(lambda: not pool & alive(), timeout=30, interval=0.2,
             what="the stopped worker to be taken for gone")


def test_a_founders_edit_of_a_tenant_goes_to_both_audit_logs(globex):
    founder, user = logged_in(superuser=True)
    keys = list(ApiKey.objects.filter(tenant=globex).order_by("id"))
    form = {"name": globex.name, "status": "active", "max_in_flight": 7,
            "api_keys-TOTAL_FORMS": len(keys), "api_keys-INITIAL_FORMS": len(keys),
            "api_keys-MIN_NUM_FORMS": 0, "api_keys-MAX_NUM_FORMS": 1000}
    for i, key in enumerate(keys):
        form.update({f"api_keys-{i}-id": key.pk, f"api_keys-{i}-tenant": globex.pk})
    try:
        saved = founder.post(f"/admin/tenants/tenant/{globex.pk}/change/", form)
        assert saved.status_code == 302, saved.content.decode()[:2000]
        assert Tenant.objects.get(pk=globex.pk).max_in_flight == 7
    finally:
        Tenant.objects.filter(pk=globex.pk).update(max_in_flight=globex.max_in_flight)
    entry = AuditEntry.objects.get(actor=f"admin:{user.username}")
    assert (entry.tenant_id, entry.action, entry.detail) == (
        globex.pk, "tenant.changed", {"via": "console", "changed": {"max_in_flight": 7}})
    assert ConsoleAccess.objects.filter(user_id=user.pk, view="tenant_action:change",
                                        tenant_schema="globex").exists()
