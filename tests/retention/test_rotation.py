"""Key rotation: archive keys are re-wrapped, bodies untouched; old versions retire; restores work."""

import pytest
from django.core.management import call_command
from django.db import connection
from django_tenants.utils import tenant_context

from runs.retention import selectors, services, store
from runs.retention.models import Archive
from tenants.services import data_key_get, tenant_create, tenant_delete
from tests.retention.conftest import run_finished
from tests.retention.test_archive import without_archive


@pytest.fixture(scope="module")
def hooli(django_db_setup, django_db_blocker):
    """A tenant of its own: rotating acme's key would change what other tests expect of it."""
    with django_db_blocker.unblock():
        tenant = tenant_create(schema_name="hooli").tenant
        connection.set_schema_to_public()
    yield tenant
    with django_db_blocker.unblock():
        tenant_delete(tenant=tenant)


def test_rotation_rewraps_archive_keys_and_restores_survive_retiring_the_old_key(s3, hooli):
    with tenant_context(hooli):
        runs = [run_finished(steps=3) for _ in range(2)]
        histories = {run.id: selectors.run_history(run_id=run.id) for run in runs}
        services.archive_pass(tenant=hooli)
        before = {a.run_id: a for a in Archive.objects.filter(run_id__in=histories)}
        bodies = {run_id: store.object_get(key=a.object_key) for run_id, a in before.items()}
        assert {a.key_version for a in before.values()} == {1}

        with pytest.raises(services.RetentionError, match="still wrapped under data key v1"):
            services.data_key_retire(tenant=hooli, version=1)

    call_command("rotate_data_key", "hooli", "--retire-old")

    assert data_key_get(tenant=hooli)[0] == 2
    assert hooli.data_keys.get(version=1).retired_at is not None
    with tenant_context(hooli):
        for run_id, old in before.items():
            archive = Archive.objects.get(run_id=run_id)
            assert archive.key_version == 2 and archive.sealed_key_version == 1
            assert bytes(archive.wrapped_key) != bytes(old.wrapped_key)
            assert archive.sha256 == old.sha256
            assert store.object_get(key=archive.object_key) == bodies[run_id]  # not re-encrypted
            assert without_archive(services.archive_restore(tenant=hooli, run_id=run_id)) \
                == histories[run_id]
        assert services.archive_keys_rewrap(tenant=hooli) == 0  # idempotent

        later = run_finished(steps=2)  # archived after the rotation: under v2 from the start
        services.archive_pass(tenant=hooli)
        assert Archive.objects.get(run_id=later.id).sealed_key_version == 2
