"""LangGraph graphs as agents on real worker processes: a worker killed (SIGKILL) in the middle
of a node resumes the graph elsewhere without repeating its effect; the shipped example parks
on its payment approval, is decided through the API, and shows in the API and the dashboard
with its nodes as steps."""

import json
import uuid
from pathlib import Path

from django.conf import settings
from django_tenants.utils import tenant_context

from integrations.services import credential_set
from runs.effects.models import Effect
from runs.graphs.models import GraphCheckpoint
from runs.models import Checkpoint, Run
from runs.services import run_start
from tests.dashboard.conftest import person, signed_in
from tests.support.api import pending_approval, status_of
from tests.support.fakes.fixtures import fake_stripe, fake_webhook, scripted_model, smtp_server  # noqa: F401
from tests.support.waiting import wait_for

SCRIPT = Path(settings.BASE_DIR) / "deploy" / "demo" / "invoice-triage.script.json"
INVOICE = (Path(settings.BASE_DIR) / "deploy" / "demo" / "INV-2041.txt").read_text()


def holder(run_id, workers):
    """The worker process that holds the run's lease now."""
    owner = wait_for(lambda: Run.objects.filter(id=run_id).exclude(lease_owner="")
                     .values_list("lease_owner", flat=True).first(), what="a lease holder")
    pid = int(owner.rsplit(":", 1)[1])
    return next(w for w in workers if pid in w.pids())


def test_a_worker_killed_mid_node_resumes_the_graph_without_repeating_its_effect(
        in_acme, fake_webhook, worker, start_worker):  # noqa: F811
    credential_set(connector="webhook", secrets={"signing_secret": "whsec_test",
                                                 "url": fake_webhook.url})
    workers = [worker, start_worker("graph-b")]
    run = run_start(agent="graph-pinger", input={"count": 4, "seconds": 3}).run
    # the second ping is recorded: its node now sleeps 3 s before the graph can checkpoint
    wait_for(lambda: Effect.objects.filter(run=run, status="done").count() == 2, timeout=60,
             what="the second ping to be recorded")
    victim = holder(run.id, workers)
    victim.kill()
    done = wait_for(lambda: (r := Run.objects.get(id=run.id)).is_finished and r, timeout=120,
                    what="the run to resume on the other worker and finish")
    assert done.status == "succeeded", done.error
    assert victim.process.poll() is not None and done.lease_epoch >= 2
    assert done.result["n"] == 4 and done.result["pings"] == [200] * 4
    # the killed node ran again on the other worker and got the recorded answer: the receiver
    # was called once per ping, never twice
    assert fake_webhook.state()["deliveries"] == 4 and fake_webhook.state()["acted"] == 4
    assert Effect.objects.filter(run=done).count() == 4
    steps = list(Checkpoint.objects.filter(run=done).order_by("visit").values_list("step", flat=True))
    assert steps == ["__start__", "ping", "ping", "ping", "ping", None]


def test_the_example_parks_on_its_payment_is_decided_in_the_inbox_and_pays_once(
        acme, acme_api, scripted_model, fake_stripe, smtp_server, worker):  # noqa: F811
    scripted_model.script(json.loads(SCRIPT.read_text())["scripts"])
    with tenant_context(acme):
        credential_set(connector="model", label="invoice-graph",
                       secrets={"api_key": "sk-scripted", "base_url": scripted_model.base_url})
        credential_set(connector="payments", label="invoice-graph",
                       secrets={"secret_key": "sk_test_graph", "api_url": fake_stripe.url})
        credential_set(connector="email", secrets={"host": "127.0.0.1", "port": smtp_server.port})
    requester = f"ada-{uuid.uuid4().hex[:6]}@acme.test"
    started = acme_api.post("/api/v1/runs", {"agent": "invoice-graph", "input": {
        "invoice": {"filename": "INV-2041.txt", "content": INVOICE}, "requester": requester,
        "model": "invoice-graph-script"}}, format="json")
    assert started.status_code == 201, started.content
    run_id = started.json()["id"]

    approval = pending_approval(acme_api, run_id)
    assert approval["request"]["title"] == "Pay 125000 eur to cus_northwind?"
    assert approval["request"]["artifact"]["amount"] == 125000 and approval["then"] == "act"
    assert fake_stripe.state()["charges"] == 0  # nothing is paid while the run waits
    decided = acme_api.post(f"/api/v1/approvals/{approval['id']}/decide",
                            {"decision": "approve", "comment": "ok"}, format="json")
    assert decided.status_code == 200

    done = status_of(acme_api, run_id, "succeeded", timeout=60)
    assert fake_stripe.state()["charges"] == 1 and len(smtp_server.messages) == 1
    assert scripted_model.requests("invoice-graph-script") == 4
    final = done["result"]["messages"][-1]
    assert final["role"] == "assistant" and "succeeded" in final["content"]
    with tenant_context(acme):
        steps = set(Checkpoint.objects.filter(run_id=run_id).values_list("step", flat=True))
        assert steps == {"__start__", "think", "act", None}
        assert GraphCheckpoint.objects.filter(thread_id=run_id).exists()

    # the API and the dashboard show it like any other run: its steps are the graph's nodes
    events = acme_api.get(f"/api/v1/runs/{run_id}/events").json()["results"]
    assert {"approval_requested", "approval_decided", "run_succeeded"} <= {e["kind"] for e in events}
    body = signed_in(person(acme, "viewer")).get(f"/t/acme/runs/{run_id}").content.decode()
    picture = body.split('aria-label="Steps picture">')[1].split("</svg>")[0]
    assert "invoice-graph" in body and all(node in picture for node in ("think", "act"))
