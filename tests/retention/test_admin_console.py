"""Operators see archive status, sizes and failures per tenant in the console."""

import uuid

from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test import Client

from runs.retention.models import Archive
from tenants.models import ConsoleAccess
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


def test_each_tenants_failure_shown_is_written_to_the_access_log(archive_pass, in_acme):
    failed = Archive.objects.create(run_id=uuid.uuid4(), status="failed", attempts=2,
                                    error="could not store it")
    connection.set_schema_to_public()
    user = User.objects.create_user(f"staff-{uuid.uuid4().hex[:8]}", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename="view_tenantarchives"))
    client = Client()
    client.force_login(user)
    page = client.get("/admin/retention/tenantarchives/").content.decode()
    assert str(failed.run_id) in page and "could not store it" in page
    rows = list(ConsoleAccess.objects.filter(user_id=user.pk)
                .values_list("tenant_schema", "view", "run_id"))
    assert ("acme", "archive_failure", failed.run_id) in rows  # its newest failure
    assert len(rows) == len({schema for schema, _, _ in rows})  # one row per tenant shown
