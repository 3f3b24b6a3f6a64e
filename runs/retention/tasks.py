"""Celery tasks: the beat job prunes the public webhook dedupe rows, then fans out one archive
pass per active tenant, each carrying the tenant's schema header (tenant-schemas-celery adds
it from the current connection)."""

from celery import shared_task
from django.db import connection
from django_tenants.utils import get_public_schema_name, tenant_context

from integrations.webhooks.services import inbox_prune
from tenants.models import Tenant
from tenants.selection import tenant_schema

from . import services


@shared_task(name="retention.archive_all_tenants")
def archive_all_tenants() -> list[str]:
    connection.set_schema_to_public()
    inbox_prune()  # the public dedupe rows; each tenant's pass prunes its inbound events
    tenants = (Tenant.objects.filter(status=Tenant.Status.ACTIVE, provisioned_at__isnull=False)
               .exclude(schema_name=get_public_schema_name()).order_by("schema_name"))
    fanned_out = []
    for tenant in tenants:
        with tenant_context(tenant):
            archive_tenant.delay()
        fanned_out.append(tenant.schema_name)
    return fanned_out


@shared_task(name="retention.archive_tenant", acks_late=True)
def archive_tenant() -> dict:
    tenant = Tenant.objects.get(schema_name=tenant_schema())
    return services.archive_pass(tenant=tenant).as_dict()
