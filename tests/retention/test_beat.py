"""The beat job fans out one archive pass per active tenant, each through a real worker."""

from django_tenants.utils import tenant_context

from runs.models import Run
from runs.retention.models import Archive
from runs.retention.tasks import archive_all_tenants
from tests.retention.conftest import run_finished
from tests.support.waiting import wait_for


def test_beat_task_archives_every_tenant_through_a_worker(s3, worker, acme, globex):
    aged = {}
    for tenant in (acme, globex):
        with tenant_context(tenant):
            aged[tenant] = run_finished(steps=2).id

    archive_all_tenants.delay()

    def archived_everywhere():
        for tenant, run_id in aged.items():
            with tenant_context(tenant):
                if Run.objects.filter(id=run_id).exists():
                    return False
                if not Archive.objects.filter(run_id=run_id, status="archived").exists():
                    return False
        return True

    wait_for(archived_everywhere, timeout=60, interval=0.2, what="both tenants' runs to be archived")
    with tenant_context(globex):
        assert Archive.objects.get(run_id=aged[globex]).object_key.startswith("tenants/globex/")
