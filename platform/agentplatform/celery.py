"""The Celery app. Tasks carry their tenant's schema in a header (tenant-schemas-celery)."""

import os

from billiard.process import current_process
from celery.signals import (
    after_setup_logger,
    after_setup_task_logger,
    task_postrun,
    task_prerun,
    worker_init,
    worker_process_init,
    worker_shutting_down,
)
from django.conf import settings
from django.db import close_old_connections
from tenant_schemas_celery.app import CeleryApp

from agentplatform import drain
from agentplatform.prometheus import worker_metrics_serve
from agentplatform.redaction import SecretsRedactingFilter
from agentplatform.telemetry import celery_instrument

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentplatform.settings")

app = CeleryApp("agentplatform")
app.config_from_object("django.conf:settings", namespace="CELERY")
# Celery's Django fixup closes every database connection before and after every task unless
# this is set (then after every 2**30th): a new PostgreSQL backend per task, with its TimeZone
# round trip and none of the engine's prepared statements. Connections are closed as Django
# closes them after a request instead (connections_recycle below).
app.conf.CELERY_DB_REUSE_MAX = 2**30
app.autodiscover_tasks()


def task_route(name, args, kwargs, options, task=None, **kw):
    """Outbox deliveries go to a queue of their own, and the webhook inbox's tasks to theirs if
    one is set (read at send time: benchmarks and tests change the queue names after
    start-up)."""
    if name.startswith("effects.outbox_"):
        return {"queue": settings.CELERY_OUTBOX_QUEUE}
    if name.startswith("webhooks.") and settings.CELERY_WEBHOOKS_QUEUE:
        return {"queue": settings.CELERY_WEBHOOKS_QUEUE}
    return None


@after_setup_logger.connect
@after_setup_task_logger.connect
def logs_redacted(logger, **kwargs):
    """A worker replaces the root logger's handlers with its own: they redact secrets too."""
    for handler in logger.handlers:
        if not any(isinstance(f, SecretsRedactingFilter) for f in handler.filters):
            handler.addFilter(SecretsRedactingFilter())


@worker_init.connect
def worker_telemetry(sender, **kwargs):
    """Celery spans in workers (their context travels in the task headers); a threads or solo
    worker runs its tasks here, so it serves its metrics here."""
    celery_instrument()
    if "prefork" not in str(sender.pool_cls).lower():
        worker_metrics_serve(offset=0)


@worker_process_init.connect
def worker_process_metrics(**kwargs):
    """A prefork pool process has metrics of its own: served on a port of its own."""
    index = getattr(current_process(), "index", None)
    if index is not None:
        worker_metrics_serve(offset=index)


@worker_process_init.connect
def worker_process_drain(**kwargs):
    """SIGTERM lets a pool process finish its run's current step (agentplatform.drain). A solo
    worker sends this signal too, in its main process: Celery's own SIGTERM handler stays."""
    if getattr(current_process(), "index", None) is not None:
        drain.pool_process_started()


@worker_shutting_down.connect
def worker_shutdown_drain(**kwargs):
    drain.worker_drain()


@task_prerun.connect
def task_started(**kwargs):
    drain.task_started()


@task_postrun.connect
def task_ended(**kwargs):
    drain.task_ended()


@task_prerun.connect
@task_postrun.connect
def connections_recycle(**kwargs):
    """Between tasks as between requests: close a connection that broke (a PostgreSQL restart)
    or outlived CONN_MAX_AGE, and keep the others (DatabaseWrapper.close_if_unusable_or_obsolete).
    A transaction a task left open is rolled back by Django's atomic, never carried over."""
    close_old_connections()
