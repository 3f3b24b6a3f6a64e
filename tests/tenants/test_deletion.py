"""Deleting a tenant removes its S3 objects (archives, workspace snapshots), this host's workspace
copies, its schema and its rows, and nothing of any other tenant."""

import os
import socket
import uuid
from datetime import timedelta

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.db import connection
from django.db.models.deletion import Collector
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from django_tenants.utils import schema_exists, tenant_context

from agentplatform.s3 import s3_client
from runs.dispatch.models import Wakeup
from runs.retention import services as retention
from runs.retention import store
from runs.retention.models import TenantArchives
from sandboxes.services import LocalWorkspace, workspace_snapshot
from tenants.models import AuditEntry, Invitation, Membership, Tenant
from tenants.people import invitation_create, member_add
from tenants.services import TenantError, tenant_create, tenant_reactivate, tenant_suspend
from tests.retention.conftest import run_finished
from tests.tenants.test_admin_console import staff_client


def put(key: str) -> str:
    s3_client().put_object(Bucket=settings.S3_BUCKET, Key=key, Body=b"x")
    return key


def stored(prefix: str) -> list[str]:
    return store.objects_under(prefix=prefix)


def tenant_with_data(schema: str, tmp_path) -> tuple[Tenant, LocalWorkspace]:
    tenant = tenant_create(schema_name=schema).tenant
    source = tmp_path / f"{schema}-workspace"
    source.mkdir()
    (source / "report.md").write_text("tenant data")
    with tenant_context(tenant):
        archived = run_finished(steps=2)
        retention.archive_pass(tenant=tenant)
        running = run_finished(steps=1, age=timedelta(0))
        workspace_snapshot(schema=schema, run_id=running.id, visit=0, path=source)
    local = LocalWorkspace(schema=schema, run_id=running.id)
    local.reset()
    local.meta_write(snapshot=None, dirty_by=None, applied=[])
    connection.set_schema_to_public()
    assert stored(f"tenants/{schema}/archives/{archived.id}")
    assert stored(f"tenants/{schema}/workspaces/{running.id}/")
    return tenant, local


def test_deleting_a_tenant_removes_its_objects_workspaces_and_schema_and_nothing_else(
        s3, acme, tmp_path):
    tenant, local = tenant_with_data("cyberdyne", tmp_path)
    # Its people: a member who is also in acme, an open invitation, audit entries.
    both = f"both-{uuid.uuid4().hex[:8]}@example.test"
    member_add(tenant=tenant, email=both, role="owner", by="test")
    member_add(tenant=acme, email=both, role="viewer", by="test")
    invitation_create(tenant=tenant, email=f"new-{uuid.uuid4().hex[:8]}@example.test",
                      role="viewer", by=f"user:{both}")
    assert AuditEntry.objects.filter(tenant=tenant).count() >= 2
    neighbour = put(f"tenants/cyberdyne2/workspaces/{uuid.uuid4()}/0.tar.gz.enc")  # same prefix, longer
    acme_source = tmp_path / "acme-workspace"
    acme_source.mkdir()
    (acme_source / "a.txt").write_text("acme's")
    with tenant_context(acme):
        acme_run = run_finished(steps=1)
        acme_snapshot = workspace_snapshot(schema="acme", run_id=acme_run.id, visit=0,
                                           path=acme_source)
    connection.set_schema_to_public()

    call_command("delete_tenant", "cyberdyne", "--yes")

    assert stored("tenants/cyberdyne/") == []
    assert not local.dir.exists() and not local.dir.parent.exists()
    assert not schema_exists("cyberdyne")
    assert not Tenant.objects.filter(pk=tenant.pk).exists()
    # its memberships, invitations and audit log go with it; the person and acme's keep theirs
    assert not Membership.objects.filter(tenant_id=tenant.pk).exists()
    assert not Invitation.objects.filter(tenant_id=tenant.pk).exists()
    assert not AuditEntry.objects.filter(tenant_id=tenant.pk).exists()
    assert Membership.objects.filter(tenant=acme, user__username=both).exists()
    assert get_user_model().objects.filter(username=both).exists()
    assert stored(neighbour) == [neighbour]
    assert stored(acme_snapshot.object_key) == [acme_snapshot.object_key]
    s3_client().delete_object(Bucket=settings.S3_BUCKET, Key=neighbour)


def test_a_deletion_stopped_by_an_unreachable_s3_keeps_the_tenant_deleting_to_delete_again(
        s3, tmp_path):
    tenant, local = tenant_with_data("soylent", tmp_path)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead = probe.getsockname()[1]
    endpoint = settings.S3_ENDPOINT_URL
    settings.S3_ENDPOINT_URL = f"http://127.0.0.1:{dead}"
    try:
        with pytest.raises(CommandError, match="S3 is unavailable"):
            call_command("delete_tenant", "soylent", "--yes")
    finally:
        settings.S3_ENDPOINT_URL = endpoint
    assert Tenant.objects.get(pk=tenant.pk).status == "deleting"
    assert schema_exists("soylent") and local.dir.exists() and stored("tenants/soylent/")

    call_command("delete_tenant", "soylent", "--yes")
    assert stored("tenants/soylent/") == [] and not schema_exists("soylent")
    assert not local.dir.exists()


def test_a_tenant_whose_deletion_began_cannot_be_reactivated(s3, tmp_path):
    tenant, _ = tenant_with_data("umbrella", tmp_path)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead = probe.getsockname()[1]
    endpoint = settings.S3_ENDPOINT_URL
    settings.S3_ENDPOINT_URL = f"http://127.0.0.1:{dead}"  # S3 unreachable: stopped half way
    try:
        with pytest.raises(CommandError, match="S3 is unavailable"):
            call_command("delete_tenant", "umbrella", "--yes")
    finally:
        settings.S3_ENDPOINT_URL = endpoint
    tenant = Tenant.objects.get(pk=tenant.pk)
    with pytest.raises(TenantError, match="being deleted"):
        tenant_reactivate(tenant=tenant)
    tenant_suspend(tenant=tenant)
    console = staff_client()
    response = console.post("/admin/tenants/tenant/", {"action": "reactivate",
                                                       "_selected_action": [tenant.pk]},
                            follow=True)
    assert "being deleted" in response.content.decode()
    edited = console.post(f"/admin/tenants/tenant/{tenant.pk}/change/", {
        "name": tenant.name, "status": "active", "max_in_flight": "",
        "api_keys-TOTAL_FORMS": "0", "api_keys-INITIAL_FORMS": "0"})
    assert edited.status_code == 302  # saved, but the status of a tenant being deleted is fixed
    assert Tenant.objects.get(pk=tenant.pk).status == "deleting"
    call_command("delete_tenant", "umbrella", "--yes")
    assert not Tenant.objects.filter(pk=tenant.pk).exists()


def test_a_crash_during_the_schema_drop_leaves_schema_and_public_rows_together(
        s3, tmp_path, monkeypatch):
    """Schema and public rows (the ready list, wakeups) go in one transaction: a crash between
    them cannot leave a wakeup naming a schema that is gone."""
    tenant, _ = tenant_with_data("tyrell", tmp_path)
    with tenant_context(tenant):
        run = run_finished(steps=1)
    Wakeup.objects.create(tenant=tenant, schema_name="tyrell", run_id=run.id, visit=0,
                          due_at=timezone.now() + timedelta(days=1))

    class Killed(BaseException):
        pass

    def killed(self):
        raise Killed  # kill -9 after DROP SCHEMA, before the tenant's rows are deleted

    with monkeypatch.context() as patched:
        patched.setattr(Collector, "delete", killed)
        with pytest.raises(Killed):
            call_command("delete_tenant", "tyrell", "--yes")
    connection.set_schema_to_public()
    assert schema_exists("tyrell") and Wakeup.objects.filter(schema_name="tyrell").exists()
    call_command("delete_tenant", "tyrell", "--yes")
    assert not schema_exists("tyrell") and not Wakeup.objects.filter(schema_name="tyrell").exists()


def test_a_workspace_written_during_the_deletion_is_swept_after_the_schema_is_dropped(
        s3, tmp_path, monkeypatch):
    tenant, local = tenant_with_data("wayne", tmp_path)
    real_drop = Tenant._drop_schema

    def worker_writes_then_drop(self, *args, **kwargs):
        local.reset()  # a worker mid-step restored the run's workspace after the first sweep
        return real_drop(self, *args, **kwargs)

    monkeypatch.setattr(Tenant, "_drop_schema", worker_writes_then_drop)
    call_command("delete_tenant", "wayne", "--yes")
    assert not local.dir.exists() and not local.dir.parent.exists()


def test_a_workspace_nested_thousands_deep_is_deleted_with_its_tenant(s3, tmp_path):
    tenant, local = tenant_with_data("tyrell", tmp_path)
    deep = str(local.path)
    os.makedirs(os.path.join(deep, *["d"] * 200))  # deeper than PATH_MAX below: built fd-relative
    fd = os.open(os.path.join(deep, *["d"] * 200), os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(1300):  # os.walk and shutil.rmtree recursed, and raised RecursionError
        os.mkdir("d", dir_fd=fd)
        child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = child
    os.close(os.open("f", os.O_CREAT | os.O_WRONLY, dir_fd=fd))
    os.close(fd)
    call_command("delete_tenant", "tyrell", "--yes")
    assert not local.dir.exists() and not local.dir.parent.exists()
    assert not Tenant.objects.filter(pk=tenant.pk).exists()


def test_deleting_rows_of_other_models_is_one_delete_not_a_select_first(acme):
    """django-tenants' schema drop listens to the tenant model and its proxies (tenants.apps):
    a receiver for every model would make each QuerySet.delete() read every row it deletes
    first."""
    with CaptureQueriesContext(connection) as queries:
        Wakeup.objects.filter(run_id=uuid.uuid4()).delete()
    sql = [q["sql"] for q in queries.captured_queries]
    assert [q for q in sql if "DELETE" in q] and not [q for q in sql if "SELECT" in q], sql


def test_a_tenant_deleted_through_a_proxy_of_the_tenant_model_loses_its_schema_too(db):
    """The console's and retention's proxies of Tenant: a delete through one sends the proxy
    as the signal's sender, which the schema drop listens to as well."""
    tenant = tenant_create(schema_name="initech").tenant
    connection.set_schema_to_public()
    assert schema_exists("initech")
    TenantArchives.objects.filter(pk=tenant.pk).delete()
    assert not schema_exists("initech")
