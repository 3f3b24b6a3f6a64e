"""The Celery app. Tasks carry their tenant's schema in a header (tenant-schemas-celery)."""

import os

from tenant_schemas_celery.app import CeleryApp

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentplatform.settings")

app = CeleryApp("agentplatform")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
