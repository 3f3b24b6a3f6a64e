"""Which tenant the current unit of work is in, for code that runs outside a request: a Celery
task's tenant comes from its schema header (tenant-schemas-celery sets the connection's schema)."""

from django.db import connection
from django_tenants.utils import get_public_schema_name


class TenantRequired(RuntimeError):
    pass


def tenant_schema() -> str:
    """The schema this task runs in; refuse the public schema rather than guess a tenant."""
    schema = connection.schema_name
    if schema == get_public_schema_name():
        raise TenantRequired("this task needs a tenant schema header (_schema_name)")
    return schema
