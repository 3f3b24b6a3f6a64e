"""Metrics and traces across processes: a web process (runserver) and a Celery worker, each with
its own metrics endpoint and its own span file; one run started over the API.

- the worker's metrics port and the web's `/metrics` expose what the run did, only to a scraper
  with the token, labelled with bounded values and no tenant data;
- one trace spans the API request and the worker's run.advance and step spans.
"""

import json
import os
import re
import time
import uuid
from pathlib import Path

import pytest
import requests

from agentplatform import localprocs
from integrations.webhooks.services import slack_connection_create
from tests.conftest import LOGS
from tests.effects.receiver import Receiver
from tests.settings import SLOT
from tests.support.fakes.smtp import free_port
from tests.support.live_server import LiveServer
from tests.support.waiting import wait_for
from tests.webhooks.slack import event_body, signed_headers

TOKEN = "metrics-" + uuid.uuid4().hex


@pytest.fixture(scope="module")
def receiver():
    server = Receiver()
    yield server
    server.close()


@pytest.fixture(scope="module")
def platform(tmp_path_factory, django_db_setup, _session_beat):
    """A web process and a worker on a queue of their own (no session worker takes the run),
    both tracing into one directory, both serving metrics to TOKEN. The session's beat is
    stopped meanwhile (the `beat` fixture starts it again): its watchdog and sweeps would hand
    a slow run or webhook item to the session's worker, outside the traces read here."""
    _session_beat.stop()
    spans = tmp_path_factory.mktemp("spans")
    queue = f"agentplatform-test{SLOT or ''}-telemetry-{uuid.uuid4().hex[:8]}"
    worker_port = free_port()
    env = {"TELEMETRY_SPANS_DIR": str(spans), "METRICS_TOKEN": TOKEN, "TEST_CELERY_QUEUE": queue,
           "RUN_SLICE_SECONDS": "30",
           "METRICS_GAUGE_CACHE_SECONDS": "0"}
    web = LiveServer(name="telemetry-web", env={**env, "METRICS_PROMETHEUS": "1"})
    worker = localprocs.Worker(f"telemetry-{time.monotonic_ns()}", 1, log_dir=LOGS,
                               env={**env, "METRICS_WORKER_PORT": str(worker_port)},
                               queues=[queue])
    try:
        web.start()
        worker.wait_ready()
        yield {"web": web, "worker": worker, "worker_metrics": f"http://127.0.0.1:{worker_port}/",
               "spans": spans}
    finally:
        worker.stop()
        web.stop()


@pytest.fixture(scope="module")
def finished_run(platform, receiver):
    """A three-step run with three effects, started over the API, run by the worker."""
    api = requests.Session()
    api.headers["Authorization"] = f"Bearer {os.environ['TEST_ACME_KEY']}"
    url = platform["web"].url
    response = api.post(f"{url}/api/v1/runs", json={
        "agent": "triple", "input": {"url": f"{receiver.base}/charge"}}, timeout=10)
    assert response.status_code == 201, response.text
    run_id = response.json()["id"]

    def ended():
        got = api.get(f"{url}/api/v1/runs/{run_id}", timeout=10)
        assert got.status_code == 200, got.text
        run = got.json()
        return run if run["status"] in ("succeeded", "failed", "cancelled") else None

    run = wait_for(ended, timeout=60, what="the run to end on the telemetry worker")
    assert run["status"] == "succeeded", (run, platform["worker"].log_tail())
    return run_id


def scrape(url: str, token: str | None = TOKEN) -> requests.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return requests.get(url, headers=headers, timeout=10)


def samples(text: str) -> dict[str, float]:
    """`name{labels}` -> value, for the platform's own series."""
    found = {}
    for line in text.splitlines():
        if line.startswith("agentplatform_"):
            series, _, value = line.rpartition(" ")
            found[series] = float(value)
    return found


def value(found: dict[str, float], name: str, **labels) -> float:
    """The sum over series of `name` whose labels include `labels`."""
    total = 0.0
    for series, number in found.items():
        metric, _, rest = series.partition("{")
        pairs = dict(re.findall(r'(\w+)="([^"]*)"', rest))
        if metric == name and all(pairs.get(k) == v for k, v in labels.items()):
            total += number
    return total


def test_a_scraper_without_the_token_is_refused(platform):
    for url in (platform["worker_metrics"], f"{platform['web'].url}/metrics"):
        assert scrape(url, token=None).status_code == 401
        assert scrape(url, token="wrong").status_code == 401


def test_the_workers_metrics_show_the_run_its_steps_checkpoints_and_effects(platform,
                                                                             finished_run):
    def counted():
        found = samples(scrape(platform["worker_metrics"]).text)
        return found if value(found, "agentplatform_runs_finished_total",
                              status="succeeded") >= 1 else None

    found = wait_for(counted, timeout=20, what="the worker to count the finished run")
    assert value(found, "agentplatform_step_duration_seconds_count", ended="Goto") >= 2
    assert value(found, "agentplatform_step_duration_seconds_count", ended="Finish") >= 1
    assert value(found, "agentplatform_checkpoint_write_duration_seconds_count",
                 durability="sync") >= 2
    assert value(found, "agentplatform_effects_total", connector="test_keyed",
                 outcome="done") >= 3


def test_the_webs_metrics_show_runs_started_and_the_fleet_gauges(platform, finished_run):
    found = samples(scrape(f"{platform['web'].url}/metrics").text)
    assert value(found, "agentplatform_runs_started_total") >= 1
    for state in ("waiting", "dispatched", "scheduled"):
        assert any(series.startswith("agentplatform_ready_depth")
                   and f'state="{state}"' in series for series in found), state
    assert any(series.startswith("agentplatform_ready_oldest_age") for series in found)
    assert any(s.startswith("agentplatform_outbox_backlog") and 'status="pending"' in s
               for s in found)
    assert any(series.startswith("agentplatform_outbox_oldest_age") for series in found)


def test_metric_labels_are_bounded_and_carry_no_tenant_data(platform, finished_run):
    text = scrape(platform["worker_metrics"]).text + scrape(f"{platform['web'].url}/metrics").text
    assert "acme" not in text and "globex" not in text and finished_run not in text
    assert TOKEN not in text and os.environ["TEST_ACME_KEY"] not in text
    allowed = {"status", "ended", "durability", "connector", "outcome", "of", "state", "source",
               "result", "reason", "write", "le", "otel_scope_name", "otel_scope_version",
               "otel_scope_schema_url", "otel_scope_attributes", "job", "instance"}
    for series in samples(text):
        labels = set(re.findall(r'(\w+)="', series.partition("{")[2]))
        assert labels <= allowed, series


def spans_read(directory: Path) -> list[dict]:
    spans = []
    for path in directory.glob("spans-*.jsonl"):
        spans += [dict(json.loads(line), pid=path.stem) for line in path.read_text().splitlines()
                  if line.strip()]
    return spans


def test_one_trace_spans_the_api_request_and_the_workers_steps(platform, finished_run):
    def traced():
        spans = spans_read(platform["spans"])
        advances = [s for s in spans if s["name"] == "run.advance"
                    and s["attributes"].get("run.id") == finished_run]
        steps = [s for s in spans if s["name"].startswith("step ")
                 and s["attributes"].get("run.id") == finished_run]
        return (spans, advances) if advances and len(steps) >= 3 else None

    spans, advances = wait_for(traced, timeout=20, what="the worker's spans of the run")
    by_id = {s["context"]["span_id"]: s for s in spans}
    [request] = [s for s in spans if s["kind"] == "SpanKind.SERVER"
                 and s["attributes"].get("http.method", s["attributes"].get(
                     "http.request.method")) == "POST"
                 and "runs" in s["name"]]
    assert request["pid"] != advances[0]["pid"]  # two processes, one trace
    for advance in advances:
        assert advance["context"]["trace_id"] == request["context"]["trace_id"]
        chain, span = [], advance
        while span.get("parent_id"):
            span = by_id[span["parent_id"]]
            chain.append(span["name"])
        assert span is request, chain  # the request is the root, the worker's spans below it
        assert any(name.startswith("run/runs.advance") for name in chain)  # Celery's run span
    steps = [s for s in spans if s["name"].startswith("step ")
             and s["context"]["trace_id"] == request["context"]["trace_id"]]
    assert {s["name"] for s in steps} >= {"step first", "step second", "step third"}
    # psycopg's statements are in the trace too, as children of what ran them
    assert any(s["attributes"].get("db.system") == "postgresql"
               and s["context"]["trace_id"] == request["context"]["trace_id"] for s in spans)


def test_a_webhook_that_resumes_a_run_is_the_root_of_the_resumed_slices_trace(platform, acme):
    secret = "telemetry-signing-" + uuid.uuid4().hex
    slack = slack_connection_create(tenant=acme, team_id=f"T{uuid.uuid4().hex[:10].upper()}",
                                    signing_secret=secret)
    channel = f"C{uuid.uuid4().hex[:10].upper()}"
    api = requests.Session()
    api.headers["Authorization"] = f"Bearer {os.environ['TEST_ACME_KEY']}"
    url = platform["web"].url
    response = api.post(f"{url}/api/v1/runs", json={"agent": "waiter", "input": {
        "how": "event", "kind": "slack.message", "key": channel}}, timeout=10)
    assert response.status_code == 201, response.text
    run_id = response.json()["id"]

    def status():
        return api.get(f"{url}/api/v1/runs/{run_id}", timeout=10).json().get("status")

    wait_for(lambda: status() == "waiting", timeout=30, what="the run to wait on the event")
    body = event_body(slack.team_id, {"type": "message", "channel": channel, "text": "go"})
    headers = {key.removeprefix("HTTP_").replace("_", "-"): value
               for key, value in signed_headers(secret, body).items()}
    answer = requests.post(f"{url}/webhooks/slack/{slack.id}/events", data=body, timeout=10,
                           headers={**headers, "Content-Type": "application/json"})
    assert answer.status_code == 200, answer.text
    wait_for(lambda: status() == "succeeded", timeout=30, what="the event to resume the run")

    def traced():
        spans = spans_read(platform["spans"])
        hooks = [s for s in spans if s["kind"] == "SpanKind.SERVER" and "slack" in s["name"]]
        resumed = [s for s in spans if s["name"] == "step event_seen"
                   and s["attributes"].get("run.id") == run_id]
        return (spans, hooks, resumed) if hooks and resumed else None

    spans, [hook], [step] = wait_for(traced, timeout=20, what="the resumed step's span")
    by_id = {s["context"]["span_id"]: s for s in spans}
    chain, span = [], step
    while span.get("parent_id"):
        span = by_id[span["parent_id"]]
        chain.append(span["name"])
    assert span is hook, chain  # webhook → run.advance (one hop: decision 0025) → the step
    assert "run.advance" in chain and not any("webhooks.inbox_deliver" in name for name in chain)
    found = samples(scrape(f"{url}/metrics").text)
    assert value(found, "agentplatform_webhook_receipts_total", source="slack_events",
                 result="accepted") >= 1


def test_scrapes_and_probes_are_not_traced(platform, finished_run):
    scrape(f"{platform['web'].url}/metrics")
    requests.get(f"{platform['web'].url}/healthz", timeout=10)
    names = {s["name"] for s in spans_read(platform["spans"]) if s["kind"] == "SpanKind.SERVER"}
    assert not any("metrics" in name or "healthz" in name for name in names), names
