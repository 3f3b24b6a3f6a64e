"""Every command `manage.py run_demo` prints (what `make run` shows) works as printed in a fresh
shell: an empty environment whose PATH has no virtualenv, in another directory, against a live
server with a real worker; run in order, they drive the onboarding demo to its end.

`manage.py run_invoice_demo` (also `make run`) defines the tenant agent invoice-triage from
deploy/demo/, runs it against the scripted model server and the payments stand-in as deploy/dev
starts them (their command lines, in an empty environment), parks on the payment's approval,
pays once and emails the requester once; defining it again makes no new version."""

import json
import re
import socket
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from django_tenants.utils import tenant_context

from integrations.services import credential_set
from integrations.webhooks.management.commands.demo_event import demo_key_path
from integrations.webhooks.management.commands.run_invoice_demo import (
    AGENT,
    DEMO_DIR,
    SCRIPTED_MODEL,
    demo_agents_define,
)
from runs.approvals.models import Approval
from runs.definitions.selectors import definition_versions
from runs.effects.models import Effect
from runs.models import Run
from tenants.services import tenant_create, tenant_delete
from tests.support.fakes.fixtures import smtp_server  # noqa: F401
from tests.support.live_server import LiveServer
from tests.support.waiting import wait_for

ROOT = DEMO_DIR.parent.parent

FRESH_PATH = "/usr/local/bin:/usr/bin:/bin"  # no .venv/bin, no pyenv shims


@pytest.fixture
def demo_tenant(s3, smtp_server):  # noqa: F811
    """A tenant of this test's own (run_demo makes it if missing; here it exists already, with
    its emails going to the SMTP fixture); dropped afterwards with the API key file run_demo
    writes into .dev/."""
    schema = f"demo{uuid.uuid4().hex[:6]}"
    tenant = tenant_create(schema_name=schema).tenant
    with tenant_context(tenant):
        credential_set(connector="email", secrets={"host": "127.0.0.1", "port": smtp_server.port})
    connection.set_schema_to_public()
    yield tenant
    demo_key_path(schema).unlink(missing_ok=True)
    tenant_delete(tenant=tenant)
    connection.set_schema_to_public()


@pytest.fixture
def demo_server():
    server = LiveServer(name="demo-server").start()
    yield server
    server.stop()


def command_groups(printed: str) -> list[str]:
    """The printed commands (lines indented by exactly seven spaces), one shell script per
    numbered step or block: consecutive command lines share a shell."""
    groups, current = [], []
    for line in printed.splitlines():
        if re.match(r"^ {7}\S", line):
            current.append(line.strip())
        elif current:
            groups.append("\n".join(current))
            current = []
    return groups + (["\n".join(current)] if current else [])


def in_fresh_shell(script: str, cwd) -> str:
    done = subprocess.run(["env", "-i", f"PATH={FRESH_PATH}", "HOME=/tmp", "bash", "-euo",
                           "pipefail", "-c", script], cwd=cwd, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, f"{script}\nexit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_every_command_run_demo_prints_works_in_a_fresh_shell_to_the_end(
        demo_tenant, demo_server, worker, smtp_server, tmp_path):  # noqa: F811
    stale = demo_key_path(demo_tenant.schema_name)  # left by a database made afresh since
    stale.parent.mkdir(parents=True, exist_ok=True)
    stale.write_text("ap_gone000000_key-of-an-earlier-database\n")
    out = StringIO()
    call_command("run_demo", tenant=demo_tenant.schema_name, url=demo_server.url, stdout=out)
    printed = out.getvalue()
    assert "python manage.py" not in printed  # the bare form fails outside the virtualenv
    assert f"{demo_server.url}/t/{demo_tenant.schema_name}/runs" in printed  # the dashboard
    run_id = re.search(r"run ([0-9a-f-]{36})", printed).group(1)
    signed, approve, delivered, watch = command_groups(printed)
    assert "docs.signed" in signed and "decide" in approve and "hardware.delivered" in delivered

    with tenant_context(demo_tenant):
        def state():
            return Run.objects.get(id=run_id)

        assert "delivered" in in_fresh_shell(signed, tmp_path)
        wait_for(lambda: Approval.objects.filter(run_id=run_id, status="pending").exists(),
                 timeout=60, what="the run to park on the manager's approval")
        decided = json.loads(in_fresh_shell(approve, tmp_path))
        assert decided["status"] == "approved", decided
        wait_for(lambda: "hardware.delivered" in state().waiting_reason, timeout=60,
                 what="the run to wait for the hardware")
        assert "delivered" in in_fresh_shell(delivered, tmp_path)
        wait_for(lambda: state().status == Run.Status.SUCCEEDED, timeout=60,
                 what="the run to finish")
        sent = sorted(Effect.objects.filter(run_id=run_id, connector="email", status="done")
                      .values_list("name", flat=True))
    assert sent == ["day_one_schedule", "welcome_packet"]
    show_run, show_events = watch.splitlines()
    assert json.loads(in_fresh_shell(show_run, tmp_path))["status"] == "succeeded"
    kinds = [event["kind"] for event in json.loads(in_fresh_shell(show_events, tmp_path))["results"]]
    assert "approval_decided" in kinds, kinds


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def demo_stand_ins(tmp_path):
    """The scripted model server and the payments stand-in, started as deploy/dev starts them."""
    model_port, payments_port = free_port(), free_port()
    commands = {
        "model": [sys.executable, "-m", "integrations.scripted_model", "--port", str(model_port),
                  "--script", str(DEMO_DIR / "invoice-triage.script.json")],
        "payments": [sys.executable, str(DEMO_DIR / "payments.py"), "--port", str(payments_port)]}
    started = {name: subprocess.Popen(argv, cwd=ROOT, env={"PATH": FRESH_PATH},
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
               for name, argv in commands.items()}
    urls = {"model": f"http://127.0.0.1:{model_port}", "payments": f"http://127.0.0.1:{payments_port}"}

    def answers(url):
        try:
            with urllib.request.urlopen(url, timeout=1):
                return True
        except urllib.error.HTTPError:
            return True  # it answered (the payments stand-in wants a key for GET)
        except OSError:
            return False

    def ready():
        for name, process in started.items():
            if process.poll() is not None:  # e.g. no integrations/scripted_model.py: say so now
                raise AssertionError(f"{commands[name]} exited: {process.stderr.read().decode()}")
        return answers(urls["model"] + "/v1/state") and answers(urls["payments"] + "/v1/charges")

    try:
        wait_for(ready, timeout=20, what="the scripted model server and the payments stand-in")
        yield urls
    finally:
        for process in started.values():
            process.terminate()
            process.wait(timeout=10)


def stand_in_state(url: str, path: str) -> dict:
    request = urllib.request.Request(url + path, headers={"Authorization": "Bearer sk_test_demo"})
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.loads(response.read())


def test_the_invoice_demo_defines_its_agent_once_parks_on_the_payment_pays_and_emails_once(
        demo_tenant, demo_stand_ins, worker, smtp_server):  # noqa: F811
    out = StringIO()
    call_command("run_invoice_demo", tenant=demo_tenant.schema_name, url="http://dashboard.test",
                 model_url=demo_stand_ins["model"] + "/v1", payments_url=demo_stand_ins["payments"],
                 stdout=out)
    printed = out.getvalue()
    print(printed)  # what `make run` shows, for a failing test's report
    run_id = re.search(r"Run ([0-9a-f-]{36}) started", printed).group(1)
    assert f"{AGENT} v1 (defined now)" in printed
    assert "turn 1: the model calls read_invoice(" in printed and "filename=INV-2041.txt)" in printed
    assert 'exited 0, printing {"amount": 125000' in printed  # the sandbox read the file it saved
    assert "turn 2: the model calls pay_invoice(amount=125000" in printed
    approval_page = re.search(r"http://dashboard\.test/t/\w+/approvals/([0-9a-f-]{36})", printed)
    assert approval_page and "Approved as owner@demo.test" in printed
    assert "Paid once (effect tool:call_1_0" in printed
    assert "turn 3: the model calls email_requester(" in printed
    assert "succeeded after 4 model turns" in printed

    # then the same invoice through the LangGraph example, invoice-graph
    assert "LangGraph demo: invoice-graph" in printed and "parked it on approval" in printed
    assert ("steps (the graph's nodes): __start__ → think → act → think → act → think → act → "
            "think" in printed)

    charges = stand_in_state(demo_stand_ins["payments"], "/v1/charges")["data"]
    assert [(c["amount"], c["currency"], c["customer"]) for c in charges] == [
        (125000, "eur", "cus_northwind")] * 2  # once by each agent
    requester = f"ada@{demo_tenant.schema_name}.test"
    mails = [m for m in smtp_server.messages if m["To"] == requester]
    assert len(mails) == 2 and {charge["id"] for charge in charges} == {
        next(c["id"] for c in charges if c["id"] in mail.get_content()) for mail in mails}
    assert stand_in_state(demo_stand_ins["model"], "/v1/state")["by_model"] == {
        SCRIPTED_MODEL: 4, "invoice-graph-script": 4}
    with tenant_context(demo_tenant):
        run = Run.objects.get(id=run_id)
        graph_run = Run.objects.get(agent="invoice-graph")
        assert graph_run.status == Run.Status.SUCCEEDED and Approval.objects.get(
            run=graph_run).decided_by == "user:owner@demo.test"
        assert run.status == Run.Status.SUCCEEDED and run.agent == AGENT
        decided = Approval.objects.get(run=run)
        assert decided.status == "approved" and decided.decided_by == "user:owner@demo.test"
        assert str(decided.id) == approval_page.group(1)
        assert (decided.request["artifact"]["amount"], decided.request["tool"]) == (125000, "pay_invoice")
        done = sorted(Effect.objects.filter(run=run, status="done").values_list("connector", flat=True))
        assert done == ["email", "model", "model", "model", "model", "payments"]
        # Another `make run` (new stand-in ports, same JSON): the same version, no new one.
        version, made = demo_agents_define(
            model_url="http://127.0.0.1:1/v1", model_key="k", model_name=SCRIPTED_MODEL,
            payments_url="http://127.0.0.1:2", payments_key="sk_test_demo", sender="x@demo.test")
        assert (version, made) == (1, False) and definition_versions(name=AGENT).count() == 1
