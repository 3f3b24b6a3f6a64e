"""The tenant-defined agent demo: define "invoice-triage" for tenant `demo` as data (the JSON in
deploy/demo/invoice-triage.json, through the same service `POST /api/v1/agents` uses), run it on
deploy/demo/INV-2041.txt, and say in words what happened: each model turn, the payment approval
the run parks on (decided here as the demo's owner, unless `--by-hand`), the email it sent.

Idempotent across `make run`s: the credentials it needs are set again (the stand-ins' ports
change), and the definition gets a new version only when its JSON changed. The model is the one
in `--model-url` (DEMO_MODEL_BASE_URL): deploy/dev starts the scripted model server, a
development stand-in that plays deploy/demo/invoice-triage.script.json, unless a real endpoint
is configured. Payments go to `--payments-url` (DEMO_PAYMENTS_API_URL; deploy/dev starts the
stand-in deploy/demo/payments.py), the email through the platform's SMTP.

Then the same invoice through `invoice-graph`, the LangGraph example (a graph run as a platform
agent: platform/agents/invoice_graph.py), with the same credentials and approval."""

import json
import os
import time
from itertools import groupby
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django_tenants.utils import tenant_context

from integrations.selectors import credential_list
from integrations.services import credential_get, credential_set
from runs.approvals.models import Approval
from runs.approvals.services import approval_decide
from runs.definitions.selectors import definition_versions
from runs.definitions.services import DefinitionError, definition_create, definition_update
from runs.effects.models import Effect
from runs.models import Checkpoint, LogEntry, Run
from runs.services import run_start
from tenants.services import tenant_create

AGENT = "invoice-triage"
DEMO_DIR = Path(settings.BASE_DIR) / "deploy" / "demo"
DEV_DIR = Path(settings.BASE_DIR) / ".dev"
DEFINITION_FILE = DEMO_DIR / "invoice-triage.json"
INVOICE_FILE = DEMO_DIR / "INV-2041.txt"
SCRIPTED_MODEL = "invoice-triage-script"  # the script's name in invoice-triage.script.json
GRAPH_AGENT = "invoice-graph"  # the LangGraph example (platform/agents/invoice_graph.py)
GRAPH_SCRIPTED_MODEL = "invoice-graph-script"
SHOWN_CHARS = 300


def demo_agents_define(*, model_url: str, model_key: str, model_name: str, payments_url: str,
                       payments_key: str, sender: str) -> tuple[int, bool]:
    """The demo's credentials and the invoice-triage definition in the current tenant:
    (version, whether this call made it)."""
    payments = {"secret_key": payments_key}
    if payments_url:  # none: Stripe itself (with a real sk_test_ key)
        payments["api_url"] = payments_url.rstrip("/")
    for label in ("demo", GRAPH_AGENT):  # the LangGraph example's label is its own name
        credential_set(connector="model", label=label,
                       secrets={"api_key": model_key, "base_url": model_url.rstrip("/")})
        credential_set(connector="payments", label=label, secrets=payments)
    if not credential_list().filter(connector="email", label="default").exists():
        # No host: the platform's SMTP relay sends it, with the tenant's address as Reply-To.
        credential_set(connector="email", secrets={"from": sender})
    spec = json.loads(DEFINITION_FILE.read_text())
    spec["model"]["name"] = model_name
    newest = definition_versions(name=AGENT).first()
    if newest is None:
        return definition_create(name=AGENT, spec=spec, by="run_invoice_demo").version, True
    stored = definition_update(name=AGENT, spec=spec, by="run_invoice_demo")
    return stored.version, stored.version != newest.version


class Command(BaseCommand):
    help = "Define the invoice-triage tenant agent (idempotent), run it, and say what it did."

    def add_arguments(self, parser):
        env = os.environ.get
        parser.add_argument("--tenant", default="demo")
        parser.add_argument("--url", default=env("AGENTPLATFORM_URL", "http://127.0.0.1:8000"),
                            help="where the dashboard answers (printed, for deciding by hand)")
        parser.add_argument("--model-url", default=env("DEMO_MODEL_BASE_URL", ""),
                            help="a Chat Completions base URL (…/v1); deploy/dev passes the "
                                 "scripted model server's unless DEMO_MODEL_BASE_URL is set")
        parser.add_argument("--model-key", default=env("DEMO_MODEL_API_KEY", "") or "scripted-demo")
        parser.add_argument("--model-name", default=env("DEMO_MODEL_NAME", "") or SCRIPTED_MODEL)
        parser.add_argument("--payments-url", default=env("DEMO_PAYMENTS_API_URL", ""))
        parser.add_argument("--payments-key", default=env("DEMO_PAYMENTS_SECRET_KEY", "") or "sk_test_demo")
        parser.add_argument("--owner", default="owner@demo.test",
                            help="the demo's owner: the approval is decided in their name")
        parser.add_argument("--by-hand", action="store_true",
                            help="leave the approval for a person (dashboard or API) and stop")
        parser.add_argument("--timeout", type=float, default=60.0,
                            help="seconds to wait for each stage (a worker must run)")

    def handle(self, tenant, url, model_url, model_key, model_name, payments_url, payments_key,
               owner, by_hand, timeout, **options):
        if not model_url:
            raise CommandError("no model: give --model-url (or DEMO_MODEL_BASE_URL), e.g. the "
                               "scripted model server's http://127.0.0.1:<port>/v1")
        if not payments_url and not payments_key.startswith("sk_test_"):
            raise CommandError("the demo pays only with Stripe test keys (sk_test_...) or through "
                               "--payments-url (the stand-in deploy/demo/payments.py)")
        demo = tenant_create(schema_name=tenant).tenant
        url = url.rstrip("/")
        requester = f"ada@{tenant}.test"
        say = self.stdout.write
        with tenant_context(demo):
            try:
                version, made = demo_agents_define(
                    model_url=model_url, model_key=model_key, model_name=model_name,
                    payments_url=payments_url, payments_key=payments_key,
                    sender=f"invoices@{tenant}.test")
            except DefinitionError as exc:
                raise CommandError(f"{AGENT} was refused: {exc.message} {exc.fields}") from None
            scripted = model_name == SCRIPTED_MODEL
            say(f"\nTenant agent demo: {AGENT} v{version} "
                f"({'defined now' if made else 'unchanged since the last make run'}), a definition "
                f"stored as data in tenant {tenant} (deploy/demo/invoice-triage.json).")
            say(f"  model {model_name} at {model_url}" + (
                " — the scripted model server: a development stand-in that plays "
                "deploy/demo/invoice-triage.script.json, not a model" if scripted else ""))
            run = run_start(agent=AGENT, by="run_invoice_demo", input={
                "invoice": {"filename": INVOICE_FILE.name, "content": INVOICE_FILE.read_text()},
                "requester": requester}).run
            say(f"Run {run.id} started: {requester} sent in {INVOICE_FILE.name} "
                f"(EUR 1,250.00 to Northwind; approval is needed above EUR 500.00).")
            story = Story(run, say)
            run = story.until(lambda r: r.status in (Run.Status.WAITING, *Run.FINISHED), timeout)
            approval = Approval.objects.filter(run=run, status=Approval.Status.PENDING).first()
            if approval is not None:
                page = f"{url}/t/{tenant}/approvals/{approval.id}"
                say(f"The run parks on approval {approval.id}: {approval.request.get('title', '')}")
                say(f"  arguments: {_short(approval.request.get('artifact'))}")
                say("  It holds no worker while it waits. To decide by hand (approve, edit the "
                    f"amount, or reject): {page}\n  signed in as {owner}.")
                if by_hand:
                    say(f"Left for you (--by-hand). Follow it at {url}/t/{tenant}/runs/{run.id}")
                    return
                approval_decide(approval_id=approval.id, approve=True, by=f"user:{owner}",
                                comment="approved by the demo (make run)")
                say(f"Approved as {owner} (what the dashboard's Approve button does).")
                run = story.until(lambda r: r.status in Run.FINISHED, timeout)
            if run.status != Run.Status.SUCCEEDED:
                raise CommandError(f"run {run.id} ended {run.status}: {run.error}")
            effects = Effect.objects.filter(run=run, status="done").order_by("created_at")
            for effect in effects.filter(connector="payments"):
                said = effect.result or {}
                say(f"Paid once (effect {effect.name}, idempotency key {effect.idempotency_key[:12]}…): "
                    f"charge {said.get('id')}, {said.get('amount')} cents {said.get('currency')}, "
                    f"{said.get('status')}")
            # The platform's relay when the tenant's email credential names no host of its own.
            relay = not credential_get(connector="email", missing_ok=True).get("host")
            mailbox = " (in .dev/mail/new)" if relay and (DEV_DIR / "mail").is_dir() else ""
            for effect in effects.filter(connector="email"):
                say(f"Email sent once (effect {effect.name}): to {effect.args.get('to')}, "
                    f"\"{effect.args.get('subject')}\", Message-ID "
                    f"{(effect.result or {}).get('message_id')}{mailbox}")
            say(f"Run {run.id} succeeded after {run.result.get('turns')} model turns "
                f"({run.tokens_used} tokens): {run.result.get('content')}")
            say(f"  its page, turn by turn: {url}/t/{tenant}/runs/{run.id}\n")
            graph_demo(say=say, url=url, tenant=tenant, owner=owner, requester=requester,
                       model_name=GRAPH_SCRIPTED_MODEL if scripted else model_name, timeout=timeout)


def graph_demo(*, say, url: str, tenant: str, owner: str, requester: str, model_name: str,
               timeout: float) -> None:
    """The same invoice through `invoice-graph`, a LangGraph graph shipped as a platform agent
    (platform/agents/invoice_graph.py), with the same credentials."""
    run = run_start(agent=GRAPH_AGENT, by="run_invoice_demo", input={
        "invoice": {"filename": INVOICE_FILE.name, "content": INVOICE_FILE.read_text()},
        "requester": requester, "model": model_name}).run
    say(f"LangGraph demo: {GRAPH_AGENT}, a LangGraph graph run as a platform agent (one step "
        f"per superstep, checkpoints in the tenant's schema). Run {run.id} started.")
    run = _until(run, lambda r: r.status in (Run.Status.WAITING, *Run.FINISHED), timeout)
    approval = Approval.objects.filter(run=run, status=Approval.Status.PENDING).first()
    if approval is not None:
        say(f"  interrupt() in node act parked it on approval {approval.id}: "
            f"{approval.request.get('title', '')}")
        approval_decide(approval_id=approval.id, approve=True, by=f"user:{owner}",
                        comment="approved by the demo (make run)")
        say(f"  Approved as {owner}: Command(resume=...) carries the decision into the node.")
        run = _until(run, lambda r: r.status in Run.FINISHED, timeout)
    if run.status != Run.Status.SUCCEEDED:
        raise CommandError(f"run {run.id} of {GRAPH_AGENT} ended {run.status}: {run.error}")
    steps = Checkpoint.objects.filter(run=run).exclude(step=None).order_by("visit")
    # a node parked and resumed has a checkpoint for each: said once
    nodes = [node for node, _ in groupby(steps.values_list("step", flat=True))]
    say(f"  steps (the graph's nodes): {' → '.join(nodes)}")
    for effect in Effect.objects.filter(run=run, status="done").order_by("created_at"):
        say(f"  effect {effect.name} ({effect.connector}) done once, key {effect.idempotency_key[:12]}…")
    say(f"Run {run.id} succeeded: {run.result['messages'][-1].get('content')}")
    say(f"  its page: {url}/t/{tenant}/runs/{run.id}\n")


def _until(run: Run, done, timeout: float) -> Run:
    deadline = time.monotonic() + timeout
    while not done(run):
        if time.monotonic() > deadline:
            raise CommandError(f"run {run.id} is still {run.status} after {timeout:.0f}s: is a "
                               "Celery worker running (make run)?")
        time.sleep(0.2)
        run.refresh_from_db()
    return run


class Story:
    """Tells the run's conversation (its append-only `messages` log) as it grows."""

    def __init__(self, run: Run, say):
        self.run, self.say, self.told, self.turns = run, say, 0, 0

    def until(self, done, timeout: float) -> Run:
        deadline = time.monotonic() + timeout
        while True:
            self.run.refresh_from_db()
            self.tell()
            if done(self.run):
                return self.run
            if time.monotonic() > deadline:
                raise CommandError(f"run {self.run.id} is still {self.run.status} after "
                                   f"{timeout:.0f}s: is a Celery worker running (make run)?")
            time.sleep(0.2)

    def tell(self) -> None:
        entries = LogEntry.objects.filter(run=self.run, log="messages", index__gte=self.told)
        for entry in entries.order_by("index"):
            self.told = entry.index + 1
            message = entry.value
            if message.get("role") == "assistant":
                self.turns += 1
                calls = message.get("tool_calls") or []
                if calls:
                    said = "; ".join(f"{c['function']['name']}({_arguments(c)})" for c in calls)
                    self.say(f"  turn {self.turns}: the model calls {said}")
                else:
                    self.say(f"  turn {self.turns}: the model answers: {_short(message.get('content'))}")
            elif message.get("role") == "tool":
                self.say(f"    {message.get('name')} → {_result(_parsed(message.get('content')))}")


def _result(answer: Any) -> str:
    """A tool's answer; a sandbox command's as its exit code and what it printed."""
    if isinstance(answer, dict) and "exit_code" in answer and "stdout" in answer:
        said = f"the sandbox command exited {answer['exit_code']}, printing {_short(answer['stdout'])}"
        return said + (f" (stderr: {_short(answer['stderr'], 120)})" if answer.get("stderr") else "")
    return _short(answer)


def _arguments(call: dict) -> str:
    arguments = _parsed(call["function"].get("arguments"))
    if not isinstance(arguments, dict):
        return _short(arguments)
    return ", ".join(f"{key}={_short(value, 60)}" for key, value in arguments.items())


def _parsed(text: Any) -> Any:
    try:
        return json.loads(text) if isinstance(text, str) else text
    except ValueError:
        return text


def _short(value: Any, limit: int = SHOWN_CHARS) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 1] + "…"
