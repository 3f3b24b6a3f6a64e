"""kill -9 of the worker between upload and prune: the redelivered pass finishes the job."""

import os
import time
from pathlib import Path

from django_tenants.utils import tenant_context

from runs.models import Run
from runs.retention import store
from runs.retention.models import Archive
from runs.retention.tasks import archive_tenant
from tests.conftest import LOGS
from tests.retention.conftest import run_finished
from tests.support.waiting import wait_for


def test_worker_killed_between_upload_and_prune_leaves_one_archive(s3, start_worker, acme):
    started = time.time()
    marker = Path(__file__).resolve().parents[2] / ".dev" / "test-logs" / \
        f"kill-after-upload-{os.environ.get('TEST_SLOT', '0')}"
    with tenant_context(acme):
        run = run_finished(steps=3)
        marker.write_text(str(run.id))
        worker = start_worker("crashing", concurrency=1)
        archive_tenant.delay()

    wait_for(lambda: not marker.exists(), timeout=60, what="the worker to reach the crash point")
    with tenant_context(acme):
        def archived():
            return (not Run.objects.filter(id=run.id).exists()
                    and Archive.objects.filter(run_id=run.id, status="archived").exists())

        wait_for(archived, timeout=90, interval=0.2, what="the redelivered pass to archive the run")
        assert Archive.objects.filter(run_id=run.id).count() == 1
        keys = [k for k in store.objects_under(prefix="tenants/acme/archives/") if str(run.id) in k]
        assert keys == [Archive.objects.get(run_id=run.id).object_key]
    # Whichever worker took the task (the session's may have) logged its child's death.
    logs = [log for log in LOGS.glob("*.log") if log.stat().st_mtime >= started]
    assert worker.log_path in logs or logs
    assert any("SIGKILL" in log.read_text(errors="replace") for log in logs)
