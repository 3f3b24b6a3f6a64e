"""The Celery app. Tasks carry their tenant's schema in a header (tenant-schemas-celery)."""

import os

from celery.signals import after_setup_logger, after_setup_task_logger
from django.conf import settings
from tenant_schemas_celery.app import CeleryApp

from agentplatform.redaction import SecretsRedactingFilter

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


@after_setup_logger.connect
@after_setup_task_logger.connect
def logs_redacted(logger, **kwargs):
    """A worker replaces the root logger's handlers with its own: they redact secrets too."""
    for handler in logger.handlers:
        if not any(isinstance(f, SecretsRedactingFilter) for f in handler.filters):
            handler.addFilter(SecretsRedactingFilter())
