"""The Celery app. Tasks carry their tenant's schema in a header (tenant-schemas-celery)."""

import os

from django.conf import settings
from tenant_schemas_celery.app import CeleryApp

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentplatform.settings")

app = CeleryApp("agentplatform")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


def task_route(name, args, kwargs, options, task=None, **kw):
    """Outbox deliveries go to a queue of their own (read at send time: benchmarks and tests
    change the queue names after start-up)."""
    if name.startswith("effects.outbox_"):
        return {"queue": settings.CELERY_OUTBOX_QUEUE}
    return None
