"""Operators see archive status, sizes and failures per tenant in the console."""

from django.db import connection

from runs.retention.models import Archive
from tests.retention.conftest import run_finished
from tests.tenants.test_admin_console import staff_client


def test_console_shows_archives_and_failures_per_tenant(archive_pass, in_acme):
    run_finished(steps=2)
    archive_pass()
    Archive.objects.create(run_id="00000000-0000-0000-0000-0000000000aa", status="failed",
                           error="S3 could not store it: boom", attempts=3)
    connection.set_schema_to_public()
    page = staff_client().get("/admin/retention/tenantarchives/").content.decode()
    for text in ("acme", "globex", "Archived runs", "Failing runs", "S3 could not store it: boom",
                 "field-archived_size", "attempt 3"):
        assert text in page, text
