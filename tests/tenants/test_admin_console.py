"""Founders' console: Django admin on the public schema, staff only."""

from django.contrib.auth.models import User
from django.db.models.functions import Now
from django.test import Client
from django_tenants.utils import tenant_context

from runs.models import Run, RunEvent
from runs.services import run_start
from tenants.models import Tenant
from tenants.services import tenant_reactivate


def staff_client() -> Client:
    user, _ = User.objects.get_or_create(username="founder", defaults={"is_staff": True,
                                                                       "is_superuser": True})
    client = Client()
    client.force_login(user)
    return client


def test_console_needs_a_staff_login():
    response = Client().get("/admin/tenants/tenant/")
    assert response.status_code == 302 and "/admin/login/" in response["Location"]
    user, _ = User.objects.get_or_create(username="customer", defaults={"is_staff": False})
    client = Client()
    client.force_login(user)
    assert client.get("/admin/tenants/tenant/").status_code == 302


def test_console_lists_tenants_with_status_and_key_count(acme, globex):
    page = staff_client().get("/admin/tenants/tenant/").content.decode()
    for column in ("acme", "globex", "active", "Active API keys", "Created at", "field-active_keys"):
        assert column in page, column


def test_founder_suspends_and_reactivates_a_tenant(globex, globex_api):
    client = staff_client()
    response = client.post("/admin/tenants/tenant/", {
        "action": "suspend", "_selected_action": [globex.pk]})
    assert response.status_code == 302
    try:
        assert Tenant.objects.get(pk=globex.pk).status == "suspended"
        assert globex_api.get("/api/v1/runs").status_code == 403
        client.post("/admin/tenants/tenant/", {"action": "reactivate",
                                              "_selected_action": [globex.pk]})
        assert Tenant.objects.get(pk=globex.pk).status == "active"
        assert globex_api.get("/api/v1/runs").status_code == 200
    finally:
        tenant_reactivate(tenant=globex)


def test_founder_sees_runs_of_a_chosen_tenant_with_their_leases_and_requeues_one(acme, globex):
    with tenant_context(globex):
        stuck = run_start(agent="research", enqueue=False).run
        Run.objects.filter(id=stuck.id).update(status="running", lease_owner="host-9:4242",
                                               lease_epoch=7, lease_expires_at=Now())
    client = staff_client()
    assert client.get("/admin/runs/run/tenant/globex/").status_code == 302
    page = client.get("/admin/runs/run/").content.decode()
    assert str(stuck.id) in page and "host-9:4242" in page and "Runs of tenant globex" in page
    client.get("/admin/runs/run/tenant/acme/")
    assert str(stuck.id) not in client.get("/admin/runs/run/").content.decode()

    client.get("/admin/runs/run/tenant/globex/")
    response = client.post("/admin/runs/run/", {"action": "requeue",
                                                "_selected_action": [str(stuck.id)]})
    assert response.status_code == 302
    with tenant_context(globex):
        run = Run.objects.get(id=stuck.id)
        # host-9's lease is gone (epoch 8, queued); a session worker left running in this shard
        # by an earlier test may have claimed the run already (epoch 9 and on)
        assert run.lease_owner != "host-9:4242"
        assert (run.status, run.lease_owner, run.lease_epoch) == ("queued", "", 8) \
            or run.lease_epoch > 8
        assert RunEvent.objects.get(run=run, kind="operator_requeued").data["by"] == "admin:founder"
