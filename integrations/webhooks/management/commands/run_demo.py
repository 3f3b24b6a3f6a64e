"""Start the onboarding demo for tenant `demo`, wait until it parks at its first wait, and print
how to advance it: in the dashboard, or with commands that work as printed in any shell (the
checkout's virtualenv Python and manage.py by absolute path, never a bare `python`).
`deploy/dev up` runs this once the web server and a worker are up."""

import os
import shlex
import sys
import time
import uuid

from django.core.management.base import BaseCommand, CommandError
from django_tenants.utils import tenant_context

from runs.models import Run
from runs.services import run_start
from tenants.services import tenant_create

from .demo_event import demo_key, demo_key_path, manage_command


def instructions(*, run: Run, tenant: str, email: str, url: str, hardware_timeout: float) -> str:
    """What to do next. Every line indented by exactly seven spaces is a shell command; the
    lines of one numbered step run in one shell (step 2's second line uses the first's
    $APPROVAL). tests/webhooks/test_run_demo.py runs them in a fresh shell."""
    manage = manage_command()
    python = shlex.quote(sys.executable)
    key = f"$(cat {shlex.quote(str(demo_key_path(tenant)))})"
    api = f"curl -s -H \"Authorization: Bearer {key}\" -H 'Content-Type: application/json'"
    pick = f"{python} -c 'import json,sys; print(json.load(sys.stdin)[\"results\"][0][\"id\"])'"
    return f"""
Onboarding demo: run {run.id} (tenant {tenant}) is {run.status}: {run.waiting_reason}
It holds no worker while it waits. Advance it in the dashboard ({url}/t/{tenant}/runs, signed
in as the demo user: the run's page sends its events, Approvals decides), or in any shell:

  1. the new hire signs the documents (an event keyed on her email):
       {manage} demo_event docs.signed {email} --tenant {tenant} --url {url} --payload '{{"signed": true}}'
     IT provisioning then runs as a child run, and the manager is asked to approve the schedule.
  2. the manager approves the day-one schedule (or Approvals in the dashboard, or Slack):
       APPROVAL=$({api} '{url}/api/v1/approvals?status=pending&run={run.id}' | {pick})
       {api} -X POST {url}/api/v1/approvals/$APPROVAL/decide -d '{{"decision": "approve"}}'
  3. the hardware arrives (else, after {hardware_timeout:.0f}s, IT gets an escalation email):
       {manage} demo_event hardware.delivered {email} --tenant {tenant} --url {url}

  Watch it (the run, then its session log):
       {api} {url}/api/v1/runs/{run.id}
       {api} {url}/api/v1/runs/{run.id}/events
"""


class Command(BaseCommand):
    help = "Start the onboarding demo run and print how to advance it."

    def add_arguments(self, parser):
        parser.add_argument("--tenant", default="demo")
        parser.add_argument("--timeout", type=float, default=60.0,
                            help="seconds to wait for the run's first wait (a worker must run)")
        parser.add_argument("--hardware-timeout", type=float, default=600.0)
        parser.add_argument("--url", default=os.environ.get("AGENTPLATFORM_URL",
                                                            "http://127.0.0.1:8000"))

    def handle(self, tenant, timeout, hardware_timeout, url, **options):
        demo = tenant_create(schema_name=tenant).tenant
        demo_key(tenant, verify=True)  # minted now, so the commands printed below work as they are
        email = f"ada-{uuid.uuid4().hex[:6]}@{tenant}.test"
        url = url.rstrip("/")
        with tenant_context(demo):
            run = run_start(agent="onboarding", input={
                "employee": {"name": "Ada Lovelace", "email": email},
                "it_email": f"it@{tenant}.test", "start_date": "next Monday",
                "hardware_timeout_seconds": hardware_timeout}).run
            deadline = time.monotonic() + timeout
            while True:
                run.refresh_from_db()
                if run.status in (Run.Status.WAITING, *Run.FINISHED):
                    break
                if time.monotonic() > deadline:
                    raise CommandError(f"run {run.id} is still {run.status} after {timeout:.0f}s: "
                                       "is a Celery worker running (make run)?")
                time.sleep(0.2)
        if run.status != Run.Status.WAITING:
            raise CommandError(f"run {run.id} ended {run.status} before its first wait: "
                               f"{run.error}")
        self.stdout.write(instructions(run=run, tenant=tenant, email=email, url=url,
                                       hardware_timeout=hardware_timeout))

