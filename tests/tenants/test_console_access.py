"""Who may do what in the founders' console, and the log of staff looking into tenants' runs.
Logged-in staff through Django's test client (real sessions in the database)."""

import uuid

import pytest
from django.contrib.auth.models import Permission, User
from django.db import DatabaseError, transaction
from django.test import Client
from django_tenants.utils import tenant_context

from runs.models import Run
from runs.services import run_start
from tenants.models import ApiKey, ConsoleAccess, Tenant
from tenants.services import tenant_reactivate

# Shares no letters with hex or the roles, so UserAttributeSimilarityValidator never
# finds it close to a random address like operator-1acfe9bc@browser.test (about 1 in 120 did).
PASSWORD = "Zq!Jy-Kx_Vm#Vz-Hq"


def logged_in(*, superuser: bool = False, permissions: tuple[str, ...] = ()) -> tuple[Client, User]:
    user = User.objects.create_user(f"staff-{uuid.uuid4().hex[:8]}", password=PASSWORD,
                                    is_staff=True, is_superuser=superuser)
    user.user_permissions.set(Permission.objects.filter(codename__in=permissions))
    client = Client()
    assert client.login(username=user.username, password=PASSWORD)
    return client, user


@pytest.fixture
def globex_run(globex):
    with tenant_context(globex):
        return run_start(agent="research", enqueue=False).run


@pytest.fixture
def globex_superusers_only(globex):
    Tenant.objects.filter(pk=globex.pk).update(superusers_only=True)
    yield
    Tenant.objects.filter(pk=globex.pk).update(superusers_only=False)


def test_staff_without_change_permission_cannot_suspend_a_tenant(globex):
    client, _ = logged_in(permissions=("view_tenant",))
    assert client.get("/admin/tenants/tenant/").status_code == 200
    try:
        client.post("/admin/tenants/tenant/", {"action": "suspend", "_selected_action": [globex.pk]})
        assert Tenant.objects.get(pk=globex.pk).status == "active"
    finally:
        tenant_reactivate(tenant=globex)

    allowed, _ = logged_in(permissions=("view_tenant", "change_tenant"))
    try:
        allowed.post("/admin/tenants/tenant/", {"action": "suspend", "_selected_action": [globex.pk]})
        assert Tenant.objects.get(pk=globex.pk).status == "suspended"
        allowed.post("/admin/tenants/tenant/", {"action": "reactivate",
                                                "_selected_action": [globex.pk]})
        assert Tenant.objects.get(pk=globex.pk).status == "active"
    finally:
        tenant_reactivate(tenant=globex)


def test_staff_looking_at_a_tenants_runs_is_logged_with_who_when_tenant_and_run(globex_run):
    client, user = logged_in(permissions=("view_run", "change_run"))
    assert client.get("/admin/runs/run/tenant/globex/").status_code == 302
    assert str(globex_run.id) in client.get("/admin/runs/run/").content.decode()
    assert client.get(f"/admin/runs/run/{globex_run.id}/change/").status_code == 200
    client.post("/admin/runs/run/", {"action": "cancel", "_selected_action": [str(globex_run.id)]})

    logged = list(ConsoleAccess.objects.filter(user_id=user.pk).order_by("at"))
    assert [(row.username, row.tenant_schema, row.view, row.run_id) for row in logged] == [
        (user.username, "globex", "run_changelist", None),
        (user.username, "globex", "run_change", globex_run.id),
        (user.username, "globex", "run_action:cancel", globex_run.id),
    ]
    assert all(row.at is not None for row in logged)


def test_founders_read_the_access_log_in_the_console_and_nobody_can_change_it(globex_run):
    looker, user = logged_in(permissions=("view_run",))
    looker.get("/admin/runs/run/tenant/globex/")
    looker.get(f"/admin/runs/run/{globex_run.id}/change/")
    row = ConsoleAccess.objects.filter(user_id=user.pk, run_id=globex_run.id).get()

    founder, _ = logged_in(superuser=True)
    page = founder.get("/admin/tenants/consoleaccess/").content.decode()
    assert user.username in page and str(globex_run.id) in page
    detail = founder.get(f"/admin/tenants/consoleaccess/{row.pk}/change/")
    assert detail.status_code == 200 and 'name="_save"' not in detail.content.decode()
    founder.post(f"/admin/tenants/consoleaccess/{row.pk}/change/", {"username": "nobody"})
    assert founder.post(f"/admin/tenants/consoleaccess/{row.pk}/delete/",
                        {"post": "yes"}).status_code == 403
    assert ConsoleAccess.objects.get(pk=row.pk).username == user.username

    for statement in (lambda: ConsoleAccess.objects.filter(pk=row.pk).update(username="x"),
                      lambda: ConsoleAccess.objects.filter(pk=row.pk).delete()):
        with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
            statement()
    assert ConsoleAccess.objects.get(pk=row.pk).username == user.username


def test_a_superusers_only_tenants_runs_are_a_404_for_other_staff(acme, globex_run,
                                                                   globex_superusers_only):
    staff, _ = logged_in(permissions=("view_run", "change_run", "view_outboxmessage"))
    assert staff.get("/admin/runs/run/tenant/globex/").status_code == 404
    assert staff.get("/admin/effects/outboxmessage/tenant/globex/").status_code == 404
    listing = staff.get("/admin/runs/run/").content.decode()  # falls back to a visible tenant
    assert "Runs of tenant acme" in listing and "/admin/runs/run/tenant/globex/" not in listing
    session = staff.session
    session["admin_runs_tenant"] = "globex"  # a tenant chosen before it was restricted
    session.save()
    assert staff.get(f"/admin/runs/run/{globex_run.id}/change/").status_code == 404
    assert staff.get("/admin/runs/run/").status_code == 404

    founder, _ = logged_in(superuser=True)
    assert founder.get("/admin/runs/run/tenant/globex/").status_code == 302
    assert founder.get(f"/admin/runs/run/{globex_run.id}/change/").status_code == 200


def test_only_superusers_can_change_who_sees_a_tenant(globex):
    staff, _ = logged_in(permissions=("view_tenant", "change_tenant"))
    page = staff.get(f"/admin/tenants/tenant/{globex.pk}/change/").content.decode()
    assert 'name="superusers_only"' not in page
    founder, _ = logged_in(superuser=True)
    page = founder.get(f"/admin/tenants/tenant/{globex.pk}/change/").content.decode()
    assert 'name="superusers_only"' in page


def test_an_action_on_all_matching_runs_is_logged_as_that_with_its_filters(globex):
    with tenant_context(globex):
        runs = [run_start(agent="research", enqueue=False).run for _ in range(2)]
    client, user = logged_in(permissions=("view_run", "change_run"))
    client.get("/admin/runs/run/tenant/globex/")
    decoy = uuid.uuid4()  # ticked, but select_across acts on every run the filters match
    client.post("/admin/runs/run/?agent=research", {
        "action": "cancel", "select_across": "1", "index": "0", "_selected_action": [str(decoy)]})
    rows = list(ConsoleAccess.objects.filter(user_id=user.pk, view__contains="_action")
                .values_list("view", "run_id", "path"))
    assert rows == [("run_action_all:cancel", None, "/admin/runs/run/?agent=research")]
    with tenant_context(globex):
        assert {Run.objects.get(id=run.id).cancel_requested for run in runs} == {True}


def test_other_staff_neither_read_the_log_of_nor_change_a_superusers_only_tenant(
        acme, globex, globex_run, globex_superusers_only):
    key_prefix = ApiKey.objects.filter(tenant=globex).values_list("prefix", flat=True).first()
    assert key_prefix
    founder, _ = logged_in(superuser=True)
    founder.get("/admin/runs/run/tenant/globex/")
    founder.get(f"/admin/runs/run/{globex_run.id}/change/")
    founder.get("/admin/runs/run/tenant/acme/")
    staff, _ = logged_in(permissions=("view_consoleaccess", "view_tenant", "change_tenant"))
    log = staff.get("/admin/tenants/consoleaccess/").content.decode()
    assert str(globex_run.id) not in log and "globex" not in log and "acme" in log
    assert str(globex_run.id) in founder.get("/admin/tenants/consoleaccess/").content.decode()

    page = staff.get(f"/admin/tenants/tenant/{globex.pk}/change/")
    assert page.status_code == 200  # read-only: no form to save, no API keys
    assert 'name="_save"' not in page.content.decode() and key_prefix not in page.content.decode()
    staff.post(f"/admin/tenants/tenant/{globex.pk}/change/",
               {"name": globex.name, "status": "suspended", "max_in_flight": 1})
    staff.post("/admin/tenants/tenant/", {"action": "suspend", "_selected_action": [globex.pk]})
    after = Tenant.objects.get(pk=globex.pk)
    assert (after.status, after.max_in_flight) == (globex.status, globex.max_in_flight)
    assert key_prefix in founder.get(f"/admin/tenants/tenant/{globex.pk}/change/").content.decode()
