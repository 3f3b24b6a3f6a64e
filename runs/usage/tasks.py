"""The beat task: recompute every active tenant's usage for today and yesterday (public
schema; each tenant's rows are read under its own schema by the service)."""

import logging

from celery import shared_task
from django.db import connection
from django_tenants.utils import get_public_schema_name

from tenants.models import Tenant

from . import services

log = logging.getLogger(__name__)


@shared_task(name="usage.refresh_all_tenants", ignore_result=True)
def refresh_all_tenants() -> list[str]:
    connection.set_schema_to_public()
    done = []
    tenants = (Tenant.objects.filter(provisioned_at__isnull=False)
               .exclude(status=Tenant.Status.DELETING)
               .exclude(schema_name=get_public_schema_name()).order_by("schema_name"))
    for tenant in tenants:
        try:
            services.usage_refresh(tenant=tenant)
        except Exception:  # one tenant's failure must not stop the others' metering
            log.exception("usage refresh of %s failed", tenant.schema_name)
            continue
        done.append(tenant.schema_name)
    return done
