"""Tenants a test makes for itself: its own schema, to migrate back and forth or to find empty."""

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connection

from tenants.models import Tenant
from tenants.services import tenant_create, tenant_delete


@contextmanager
def tenant_of_its_own(prefix: str) -> Iterator[Tenant]:
    """A new tenant (`prefix` and a random suffix), its schema migrated to the latest; deleted
    after, its objects in S3 too (the test needs the `s3` fixture). The connection is left on
    the public schema, before and after."""
    tenant = tenant_create(schema_name=f"{prefix}{uuid.uuid4().hex[:8]}").tenant
    connection.set_schema_to_public()
    try:
        yield tenant
    finally:
        connection.set_schema_to_public()
        tenant_delete(tenant=tenant)
