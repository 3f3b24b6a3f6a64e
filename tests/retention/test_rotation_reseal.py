"""Rotating a tenant's data key re-seals everything sealed under it (credentials, Slack signing
secrets, workspace snapshots, archive keys); once retired, an old version opens nothing."""

import threading

import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import connection, connections
from django_tenants.utils import tenant_context

import integrations.services as credential_services
import sandboxes.services as sandbox_services
from agentplatform.s3 import s3_client
from integrations.models import Credential
from integrations.services import credential_get, credential_open, credential_set
from integrations.webhooks.models import SlackConnection
from integrations.webhooks.sealing import secret_open
from integrations.webhooks.services import slack_connection_create, slack_signing_secret
from runs.retention import services, store
from runs.retention.models import Archive
from runs.services import run_start
from sandboxes.models import WorkspaceSnapshot
from sandboxes.services import workspace_restore, workspace_snapshot
from tenants.services import TenantError, data_key_create, data_key_get, tenant_create, tenant_delete
from tests.retention.conftest import run_finished
from tests.support.waiting import wait_for

SECRETS = {"bot_token": "xoxb-rotation-test"}


@pytest.fixture(scope="module")
def initrode(django_db_setup, django_db_blocker):
    """A tenant of its own: rotating acme's or globex's key would change what other tests see."""
    with django_db_blocker.unblock():
        tenant = tenant_create(schema_name="initrode").tenant
        connection.set_schema_to_public()
    yield tenant
    with django_db_blocker.unblock():
        tenant_delete(tenant=tenant)


def test_rotation_reseals_credentials_slack_secrets_and_snapshots_and_old_keys_open_nothing(
        s3, initrode, tmp_path):
    slack = slack_connection_create(tenant=initrode, team_id="T-ROTATE",
                                    signing_secret="rotate-me-signing-secret")
    old_slack_sealed = bytes(slack.signing_secret_sealed)
    source = tmp_path / "workspace"
    source.mkdir()
    (source / "notes.txt").write_text("kept across the rotation")
    with tenant_context(initrode):
        credential_set(connector="slack", secrets=SECRETS)
        old_credential = Credential.objects.get(connector="slack")
        run = run_start(agent="research", enqueue=False).run
        old_snapshot = workspace_snapshot(schema="initrode", run_id=run.id, visit=0, path=source)
        old_blob = s3_client().get_object(Bucket=settings.S3_BUCKET,
                                          Key=old_snapshot.object_key)["Body"].read()

        data_key_create(tenant=initrode)  # v2, with nothing re-sealed under it yet
        with pytest.raises(services.RetentionError) as refused:
            services.data_key_retire(tenant=initrode, version=1)
        for what in ("1 credential(s)", "1 Slack signing secret(s)", "1 workspace snapshot(s)"):
            assert what in str(refused.value)

    call_command("rotate_data_key", "initrode", "--retire-old")

    assert data_key_get(tenant=initrode)[0] == 3
    assert set(initrode.data_keys.filter(retired_at=None).values_list("version", flat=True)) == {3}
    slack = SlackConnection.objects.get(id=slack.id)
    assert slack.data_key_version == 3 and bytes(slack.signing_secret_sealed) != old_slack_sealed
    assert slack_signing_secret(slack) == "rotate-me-signing-secret"
    with tenant_context(initrode):
        credential = Credential.objects.get(connector="slack")
        assert credential.key_version == 3 and bytes(credential.ciphertext) != bytes(
            old_credential.ciphertext)
        assert credential_get(connector="slack") == SECRETS
        snapshot = WorkspaceSnapshot.objects.get(pk=old_snapshot.pk)
        assert snapshot.key_version == 3 and snapshot.sha256 != old_snapshot.sha256
        restored = tmp_path / "restored"
        restored.mkdir()
        workspace_restore(schema="initrode", snapshot=snapshot, path=restored)
        assert (restored / "notes.txt").read_text() == "kept across the rotation"
        assert store.objects_under(prefix=f"tenants/initrode/workspaces/{run.id}/") == [
            snapshot.object_key]  # the object sealed under v1 is gone

        # What was sealed under v1, presented again after the rotation, opens nothing.
        with pytest.raises(TenantError, match="retired"):
            credential_open(credential=old_credential)
        with pytest.raises(TenantError, match="retired"):
            data_key_get(tenant=initrode, version=old_snapshot.key_version)
        assert services.data_key_reseal(tenant=initrode, to_version=3) == {
            "archives": 0, "credentials": 0, "slack_secrets": 0, "workspace_snapshots": 0}
    with pytest.raises(TenantError, match="retired"):
        secret_open(tenant=initrode, sealed=old_slack_sealed, version=1,
                    bound_to=f"webhooks.slack_connection:{slack.id}:signing_secret")
    assert old_blob not in [s3_client().get_object(Bucket=settings.S3_BUCKET, Key=key)["Body"].read()
                            for key in store.objects_under(prefix="tenants/initrode/")]


def test_a_snapshot_retaken_after_its_reseal_replaces_the_resealed_object(s3, initrode, tmp_path):
    source = tmp_path / "workspace"
    source.mkdir()
    (source / "a.txt").write_text("first")
    with tenant_context(initrode):
        run = run_start(agent="research", enqueue=False).run
        workspace_snapshot(schema="initrode", run_id=run.id, visit=4, path=source)
        services.data_key_rotate(tenant=initrode)
        resealed = WorkspaceSnapshot.objects.get(run_id=run.id, visit=4)
        (source / "a.txt").write_text("second")  # the step ran again: its snapshot is re-taken
        retaken = workspace_snapshot(schema="initrode", run_id=run.id, visit=4, path=source)
        assert retaken.object_key != resealed.object_key
        assert store.objects_under(prefix=f"tenants/initrode/workspaces/{run.id}/") == [
            retaken.object_key]
        restored = tmp_path / "restored"
        restored.mkdir()
        workspace_restore(schema="initrode", snapshot=retaken, path=restored)
        assert (restored / "a.txt").read_text() == "second"


# -- rotation racing writers ---------------------------------------------------------------------

def in_thread(target, *, tenant, name: str) -> tuple[threading.Thread, dict]:
    """Run `target()` in the tenant's schema on a connection of its own; its result or error."""
    out: dict = {}

    def body():
        try:
            with tenant_context(tenant):
                out["result"] = target()
        except Exception as exc:  # noqa: BLE001 - handed to the test
            out["error"] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=body, name=name)
    thread.start()
    return thread, out


def waiting_on_data_key_lock() -> bool:
    """Whether some session waits for a lock on a data key row (a retirement behind a writer)."""
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")  # activity is cached per transaction
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                       "AND wait_event_type = 'Lock' AND query ILIKE '%%tenants_tenantkey%%'")
        return cursor.fetchone()[0] > 0


def rotation_blocked_or_done(rotation: threading.Thread) -> bool:
    return not rotation.is_alive() or waiting_on_data_key_lock()


def test_a_snapshot_being_written_while_its_key_is_retired_is_resealed_not_stranded(
        s3, initrode, tmp_path, monkeypatch):
    source = tmp_path / "workspace"
    source.mkdir()
    (source / "f.txt").write_text("step output")
    with tenant_context(initrode):
        run = run_start(agent="research", enqueue=False).run
    uploading, release = threading.Event(), threading.Event()
    real_client = sandbox_services.s3_client

    class SlowUpload:  # the worker's PUT, stalled after it took the newest key
        def __init__(self):
            self.client = real_client()

        def put_object(self, **kwargs):
            if threading.current_thread().name == "worker":
                uploading.set()
                assert release.wait(30)
            return self.client.put_object(**kwargs)

        def __getattr__(self, name):
            return getattr(self.client, name)

    monkeypatch.setattr(sandbox_services, "s3_client", SlowUpload)
    worker, written = in_thread(lambda: workspace_snapshot(schema="initrode", run_id=run.id,
                                                           visit=1, path=source),
                                tenant=initrode, name="worker")
    wait_for(uploading.is_set, what="the worker mid-upload")
    rotation, rotated = in_thread(lambda: services.data_key_rotate(tenant=initrode, retire_old=True),
                                  tenant=initrode, name="operator")
    wait_for(lambda: rotation_blocked_or_done(rotation), what="the rotation done or waiting")
    release.set()
    worker.join(30)
    rotation.join(30)
    assert "error" not in written and "error" not in rotated, (written, rotated)
    active = rotated["result"].version
    assert list(initrode.data_keys.filter(retired_at=None).values_list("version", flat=True)) == [
        active]
    with tenant_context(initrode):
        snapshot = WorkspaceSnapshot.objects.get(run_id=run.id, visit=1)
        assert snapshot.key_version == active  # re-sealed after the writer committed
        restored = tmp_path / "restored"
        restored.mkdir()
        workspace_restore(schema="initrode", snapshot=snapshot, path=restored)
        assert (restored / "f.txt").read_text() == "step output"


def test_an_archive_committed_during_a_rotation_and_retire_stays_readable(
        s3, initrode, monkeypatch):
    with tenant_context(initrode):
        run = run_finished(steps=3)
    rotation: dict = {}

    def rotate_meanwhile(run_id):  # the operator's rotate_data_key --retire-old, elsewhere
        thread, out = in_thread(lambda: services.data_key_rotate(tenant=initrode, retire_old=True),
                                tenant=initrode, name="operator")
        rotation.update(thread=thread, out=out)
        wait_for(lambda: rotation_blocked_or_done(thread), what="the rotation done or waiting")

    monkeypatch.setattr(services, "after_upload", rotate_meanwhile)
    with tenant_context(initrode):
        report = services.archive_pass(tenant=initrode)
    rotation["thread"].join(30)
    assert report.archived >= 1 and "error" not in rotation["out"], rotation["out"]
    active = rotation["out"]["result"].version
    assert list(initrode.data_keys.filter(retired_at=None).values_list("version", flat=True)) == [
        active]
    with tenant_context(initrode):
        assert Archive.objects.get(run_id=run.id).key_version == active
        history = services.archive_restore(tenant=initrode, run_id=run.id)
    assert history["archive"]["key_version"] == active


def test_a_credential_sealed_during_a_rotation_and_retire_stays_readable(
        initrode, monkeypatch):
    sealing, release = threading.Event(), threading.Event()
    real_binding = credential_services._associated_data

    def slow_binding(*args):  # the writer stalls after it took the newest key, before its row
        if threading.current_thread().name == "writer":
            sealing.set()
            assert release.wait(30)
        return real_binding(*args)

    monkeypatch.setattr(credential_services, "_associated_data", slow_binding)
    writer, written = in_thread(lambda: credential_set(connector="email", secrets={"p": "w"},
                                                       label="race"),
                                tenant=initrode, name="writer")
    wait_for(sealing.is_set, what="the writer mid-seal")
    rotation, rotated = in_thread(lambda: services.data_key_rotate(tenant=initrode, retire_old=True),
                                  tenant=initrode, name="operator")
    wait_for(lambda: rotation_blocked_or_done(rotation), what="the rotation done or waiting")
    release.set()
    writer.join(30)
    rotation.join(30)
    assert "error" not in written and "error" not in rotated, (written, rotated)
    with tenant_context(initrode):
        assert credential_get(connector="email", label="race") == {"p": "w"}


def test_a_second_rotation_of_a_tenant_is_refused_while_one_runs(initrode, monkeypatch):
    resealing, release = threading.Event(), threading.Event()
    real_reseal = services.data_key_reseal

    def slow_reseal(**kwargs):
        if threading.current_thread().name == "first":
            resealing.set()
            assert release.wait(30)
        return real_reseal(**kwargs)

    monkeypatch.setattr(services, "data_key_reseal", slow_reseal)
    first, out = in_thread(lambda: services.data_key_rotate(tenant=initrode, retire_old=True),
                           tenant=initrode, name="first")
    wait_for(resealing.is_set, what="the first rotation re-sealing")
    try:
        with tenant_context(initrode), pytest.raises(services.RetentionError,
                                                     match="already running"):
            services.data_key_rotate(tenant=initrode, retire_old=True)
    finally:
        release.set()
        first.join(30)
    assert "error" not in out, out
    assert list(initrode.data_keys.filter(retired_at=None).values_list("version", flat=True)) == [
        out["result"].version]
