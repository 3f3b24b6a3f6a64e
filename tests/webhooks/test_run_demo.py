"""Every command `manage.py run_demo` prints (what `make run` shows) works as printed in a fresh
shell: an empty environment whose PATH has no virtualenv, in another directory, against a live
server with a real worker; run in order, they drive the onboarding demo to its end."""

import json
import re
import subprocess
import uuid
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from django_tenants.utils import tenant_context

from integrations.services import credential_set
from integrations.webhooks.management.commands.demo_event import demo_key_path
from runs.approvals.models import Approval
from runs.effects.models import Effect
from runs.models import Run
from tenants.services import tenant_create, tenant_delete
from tests.support.fakes.fixtures import smtp_server  # noqa: F401
from tests.support.live_server import LiveServer
from tests.support.waiting import wait_for

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
