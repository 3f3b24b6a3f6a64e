"""A webhook wakes its run in one hop: the request records the event, resolves the gate, makes
the run ready and hands it out in its own transaction, and the run's task is sent as that
commits; the worker that claims it is the only Celery hop. A replay wakes nothing twice, a task
that cannot be sent is sent again later, and a tenant's max_in_flight still holds."""

import json
import uuid

import redis
import requests
from django.conf import settings
from django.db.models import Q
from django.db.models.functions import Now
from django_tenants.utils import tenant_context

from integrations.webhooks.models import InboxItem
from runs.approvals.models import InboundEvent
from runs.dispatch.models import ReadyRun
from runs.models import Run, RunEvent
from tenants.models import Tenant
from tests.support.api import start, status_of
from tests.support.live_server import LiveServer
from tests.support.waiting import wait_for
from tests.webhooks.slack import event_body, signed_headers
from tests.webhooks.test_inbox import broker_flush, workers  # noqa: F401
from tests.webhooks.test_slack import SECRET, acme_slack, post_event  # noqa: F401


def queued_tasks(*run_ids: str) -> list[tuple[str, list]]:
    """The task messages waiting in this slot's broker db, (task name, args), but the runs'
    tasks of runs other than these (a dispatch also hands out what earlier tests left in
    line)."""
    broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    found = []
    for key in broker.scan_iter():
        if broker.type(key) != b"list":
            continue
        for raw in broker.lrange(key, 0, -1):
            headers = json.loads(raw)["headers"]
            args = json.loads(headers["argsrepr"].replace("'", '"'))
            if not headers["task"].startswith("runs.") or args[0] in run_ids:
                found.append((headers["task"], args))
    return found


def handed_out(run_id) -> bool:
    """Whether the run's row counts as handed out; if not, the ready list says why (the
    caps: acme's max_in_flight, DISPATCH_MAX_IN_FLIGHT over every tenant)."""
    row = ReadyRun.objects.get(run_id=run_id)
    if row.dispatched_at is not None:
        return True
    lines = [f"{r.schema_name} {r.run_id} branch={r.branch} ready={r.ready_at:%T.%f} "
             f"dispatched={r.dispatched_at and f'{r.dispatched_at:%T.%f}'}"
             for r in ReadyRun.objects.order_by("ready_at")]
    raise AssertionError(f"{run_id} not handed out; the ready list:\n" + "\n".join(lines))


def parked_on_event(acme_api, channel: str) -> str:
    run_id = start(acme_api, how="event", kind="slack.message", key=channel)
    status_of(acme_api, run_id, "waiting")
    return run_id


def message(acme_slack, channel: str, text: str = "hi") -> bytes:  # noqa: F811
    return event_body(acme_slack.team_id, {"type": "message", "channel": channel, "text": text})


def test_a_webhook_wakes_its_run_with_one_hop_and_a_replay_wakes_nothing(
        acme, acme_api, acme_slack, workers, no_beat, room):  # noqa: F811
    channel = f"C{uuid.uuid4().hex[:9].upper()}"
    run_id = parked_on_event(acme_api, channel)
    workers.stop()  # nothing consumes the broker: what the request sent stays there
    broker_flush()
    body = message(acme_slack, channel)
    assert post_event(acme_slack, body).status_code == 200
    # Delivered in the request: the run is queued and handed out, its task in the broker.
    stored = InboxItem.objects.get(tenant=acme, source_id=f"slack:{json.loads(body)['event_id']}")
    assert (stored.status, stored.outcome, stored.attempts) == ("delivered", "resumed 1", 1)
    assert handed_out(run_id)
    assert queued_tasks(run_id) == [("runs.advance", [run_id])]
    assert post_event(acme_slack, body).status_code == 200  # Slack's retry, or a replay
    assert queued_tasks(run_id) == [("runs.advance", [run_id])]
    workers.start()  # and no beat: no dispatcher tick, no inbox sweep
    assert status_of(acme_api, run_id, "succeeded")["result"]["text"] == "hi"
    with tenant_context(acme):
        assert RunEvent.objects.filter(run_id=run_id, kind="event_received").count() == 1


def test_an_event_whose_task_cannot_be_sent_is_delivered_and_its_run_sent_later(
        acme, acme_api, acme_slack, worker):  # noqa: F811
    # A web server whose broker is away (nothing listens on port 1); workers and beat have theirs.
    server = LiveServer(name="webhooks-no-broker", env={
        "TEST_REDIS_URL": "redis://127.0.0.1:1/0", "CACHE_URL": settings.CELERY_BROKER_URL,
    }).start()
    try:
        channel = f"C{uuid.uuid4().hex[:9].upper()}"
        runs = [parked_on_event(acme_api, channel) for _ in range(3)]
        body = message(acme_slack, channel, "later")
        headers = {key.removeprefix("HTTP_").replace("_", "-"): value
                   for key, value in signed_headers(SECRET, body).items()}
        # Slack gives up after 3 s and retries: the answer must not wait on the broker (a
        # send once took 19 s, Celery reconnecting to a result backend nobody reads).
        answer = requests.post(f"{server.url}/webhooks/slack/{acme_slack.id}/events", data=body,
                               headers={"Content-Type": "application/json", **headers},
                               timeout=10)
        assert answer.status_code == 200, answer.text
        # One failed send, not three: the first that fails puts it and the rest back in line.
        assert wait_for(lambda: server.log_tail(20000).count("doorbell not rung"),
                        what="the web server to log the send it could not make") == 1
        stored = InboxItem.objects.get(tenant=acme,
                                       source_id=f"slack:{json.loads(body)['event_id']}")
        assert (stored.status, stored.outcome) == ("delivered", "resumed 3")
        for run_id in runs:
            assert status_of(acme_api, run_id, "succeeded")["result"]["text"] == "later"
    finally:
        server.stop()
    with tenant_context(acme):
        for run_id in runs:
            assert RunEvent.objects.filter(run_id=run_id, kind="event_received").count() == 1
        assert InboundEvent.objects.filter(key=channel).count() == 1


def test_a_tenant_at_its_max_in_flight_gets_its_woken_run_in_line_not_sent(
        acme, acme_api, acme_slack, workers, no_beat, room):  # noqa: F811
    first, second = (f"C{uuid.uuid4().hex[:9].upper()}" for _ in range(2))
    runs = [parked_on_event(acme_api, first), parked_on_event(acme_api, second)]
    workers.stop()
    broker_flush()
    # Room for one more than acme has handed out or in line ahead (earlier tests' leftovers,
    # which nothing hands out or takes back meanwhile: no worker, no beat).
    ahead = ReadyRun.objects.filter(tenant=acme).filter(
        Q(dispatched_at__isnull=False) | Q(ready_at__lte=Now())).count()
    Tenant.objects.filter(pk=acme.pk).update(max_in_flight=ahead + 1)
    try:
        assert post_event(acme_slack, message(acme_slack, first)).status_code == 200
        assert post_event(acme_slack, message(acme_slack, second)).status_code == 200
        assert handed_out(runs[0])
        assert ReadyRun.objects.get(run_id=runs[1]).dispatched_at is None  # in line
        with tenant_context(acme):
            assert Run.objects.get(id=runs[1]).status == "queued"
        assert queued_tasks(*runs) == [("runs.advance", [runs[0]])]
        workers.start()  # the first run's worker hands the freed slot to the second
        for run_id in runs:
            status_of(acme_api, run_id, "succeeded")
    finally:
        Tenant.objects.filter(pk=acme.pk).update(max_in_flight=None)
