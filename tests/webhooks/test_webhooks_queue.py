"""The webhook inbox's redeliveries go to a queue of their own when CELERY_WEBHOOKS_QUEUE is set
(the production layout: a worker per queue), and a real worker on that queue alone delivers
them. No beat: the sweep runs here, with this process's routing."""

import uuid

import pytest
import redis
from django.conf import settings
from django.db.models.functions import Now

from agentplatform import localprocs
from integrations.webhooks.models import InboxItem
from integrations.webhooks.services import inbox_sweep
from tests.conftest import LOGS
from tests.support.waiting import wait_for

pytestmark = pytest.mark.usefixtures("no_beat")


def test_a_redelivery_travels_on_the_webhooks_queue_to_the_worker_that_takes_it(
        acme, monkeypatch, celery_queue_clean, s3):
    queue = f"{settings.CELERY_TASK_DEFAULT_QUEUE}-webhooks-{uuid.uuid4().hex[:6]}"
    monkeypatch.setattr(settings, "CELERY_WEBHOOKS_QUEUE", queue)  # read at send time
    broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    # accepted, its delivery in the request failed once: due again now
    item = InboxItem.objects.create(
        tenant=acme, kind=InboxItem.Kind.GMAIL_PUSH, source_id=f"gmail:{uuid.uuid4().hex}",
        payload={"mailbox": "ops@acme.test", "historyId": "1", "messageId": uuid.uuid4().hex},
        attempts=1, last_error="OperationalError: injected", next_attempt_at=Now())
    try:
        assert inbox_sweep() >= 1
        assert broker.llen(queue) >= 1  # on its own queue, not the runs' one
        worker = localprocs.Worker(f"webhooks-{uuid.uuid4().hex[:6]}", 1, log_dir=LOGS,
                                   queues=[queue], pool="threads").wait_ready()
        try:
            delivered = wait_for(
                lambda: (row := InboxItem.objects.get(id=item.id)).status == "delivered" and row,
                timeout=30, what="the webhooks worker to deliver the item")
        finally:
            worker.stop()
        assert (delivered.outcome, delivered.attempts) == ("resumed 0", 2)
    finally:
        broker.delete(queue)
        InboxItem.objects.filter(id=item.id).delete()
