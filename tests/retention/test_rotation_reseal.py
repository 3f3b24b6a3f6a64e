"""Rotating a tenant's data key re-seals everything sealed under it (credentials, Slack signing
secrets, workspace snapshots, archive keys); once retired, an old version opens nothing."""

import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import connection
from django_tenants.utils import tenant_context

from agentplatform.s3 import s3_client
from integrations.models import Credential
from integrations.services import credential_get, credential_open, credential_set
from integrations.webhooks.models import SlackConnection
from integrations.webhooks.sealing import secret_open
from integrations.webhooks.services import slack_connection_create, slack_signing_secret
from runs.retention import services, store
from runs.services import run_start
from sandboxes.models import WorkspaceSnapshot
from sandboxes.services import workspace_restore, workspace_snapshot
from tenants.services import TenantError, data_key_create, data_key_get, tenant_create, tenant_delete

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
