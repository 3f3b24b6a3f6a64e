"""The Runs page: the list with filters (a shareable GET query), its rows refreshed live by htmx,
bulk cancel and re-queue (confirmed, with a count first), and the form that starts a run.

Reads come from runs.selectors.run_list and writes from runs.services, as in the API."""

import json
import uuid

from django import forms
from django.contrib import messages
from django.core.exceptions import ValidationError
from django.http import QueryDict
from django.shortcuts import redirect, render
from django.urls import path, reverse

from agentplatform.errors import ServiceError
from runs import services
from runs.agents import registry
from runs.definitions.selectors import definitions_latest
from runs.models import Run
from runs.selectors import WAITING_FOR, run_list, run_or_404
from tenants.roles import RUNS_WRITE

from ..access import tenant_page
from ..typed_json import json_typed

PAGE = 50
MAX_PAGE = 200  # offset paging: deep pages cost a scan; narrow the filters instead
BULK_MAX = 500  # run ids per bulk action: a page's worth, with room

WAITS = [("approval", "an approval"), ("event", "an event"), ("timer", "a timer"),
         ("child", "a child run")]
assert [value for value, _ in WAITS] == list(WAITING_FOR)


class RunFilterForm(forms.Form):
    status = forms.MultipleChoiceField(choices=Run.Status.choices, required=False,
                                       widget=forms.CheckboxSelectMultiple)
    agent = forms.CharField(required=False, max_length=100,
                            widget=forms.TextInput(attrs={"list": "agent-names"}))
    version = forms.IntegerField(required=False, min_value=1, max_value=2_147_483_647)
    created_from = forms.DateTimeField(
        required=False, label="Created from",
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}))
    created_to = forms.DateTimeField(
        required=False, label="Created before",
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}))
    text = forms.CharField(required=False, max_length=200, label="Text in input or result")
    waiting_for = forms.MultipleChoiceField(choices=WAITS, required=False, label="Waiting for",
                                            widget=forms.CheckboxSelectMultiple)
    page = forms.IntegerField(required=False, min_value=1, max_value=MAX_PAGE)

    def clean(self):
        data = super().clean()
        start, end = data.get("created_from"), data.get("created_to")
        if start and end and start >= end:
            raise ValidationError("“Created from” must be before “Created before”.")
        return data

    def filters(self) -> dict:
        """run_list's keyword arguments from the valid fields (an invalid one filters nothing)."""
        data = self.cleaned_data
        return {"statuses": data.get("status") or None, "agent": data.get("agent") or None,
                "version": data.get("version"), "created_from": data.get("created_from"),
                "created_to": data.get("created_to"), "text": data.get("text") or None,
                "waiting_for": data.get("waiting_for") or None}


def _listing(request) -> dict:
    """The filtered page of runs, newest first, and what the template needs to draw it."""
    form = RunFilterForm(request.GET)
    form.is_valid()  # invalid fields are dropped from cleaned_data and shown next to the form
    page = form.cleaned_data.get("page") or 1
    runs, error = [], None
    try:
        rows = run_list(**form.filters()).order_by("-created_at", "-id")
        runs = list(rows[(page - 1) * PAGE: page * PAGE + 1])
    except ServiceError as exc:
        error = exc.message
    query = request.GET.copy()
    query.pop("page", None)
    return {"form": form, "runs": runs[:PAGE], "page": page, "error": error,
            "older": page + 1 if len(runs) > PAGE and page < MAX_PAGE else None,
            "newer": page - 1 if page > 1 else None,
            "query": query.urlencode(), "full_query": request.GET.urlencode(),
            "filtered": any(v for k, v in request.GET.lists() if k != "page"),
            "agent_names": sorted({agent.name for agent in registry.available()})}


@tenant_page()
def runs(request, tenant):
    context = _listing(request)
    if request.htmx:  # the live refresh: only the rows, with the same filters
        return render(request, "dashboard/runs/_rows.html", context)
    return render(request, "dashboard/runs/list.html", {"section": "runs", **context})


# -- bulk cancel and re-queue -----------------------------------------------------------------

ACTIONS = {"cancel": ("Cancel", "cancelled"), "requeue": ("Re-queue", "re-queued")}


def _run_ids(values: list[str]) -> tuple[list[uuid.UUID], int]:
    """The distinct well-formed run ids, in order, and how many values were not run ids."""
    ids, malformed = [], 0
    for value in values[:BULK_MAX]:
        try:
            run_id = uuid.UUID(value)
        except ValueError:
            malformed += 1
            continue
        if run_id not in ids:
            ids.append(run_id)
    return ids, malformed


def _back_to_list(tenant: str, query: str):
    # `query` came back from our own form: parsed and re-encoded, so it stays a query string
    params = QueryDict(query).urlencode()
    return redirect(reverse("dashboard:runs", args=[tenant]) + (f"?{params}" if params else ""))


@tenant_page(RUNS_WRITE)
def runs_bulk(request, tenant):
    if request.method != "POST":
        return redirect("dashboard:runs", tenant)
    action = request.POST.get("action", "")
    query = request.POST.get("query", "")
    if action not in ACTIONS:
        messages.error(request, "Choose an action: cancel or re-queue.")
        return _back_to_list(tenant, query)
    ids, malformed = _run_ids(request.POST.getlist("run"))
    if not ids and not malformed:
        messages.error(request, "Select at least one run.")
        return _back_to_list(tenant, query)
    verb, done = ACTIONS[action]
    if request.POST.get("confirm") != "1":
        found = list(run_list().filter(id__in=ids).order_by("-created_at"))
        return render(request, "dashboard/runs/confirm.html", {
            "section": "runs", "action": action, "verb": verb, "runs": found,
            "missing": len(ids) - len(found) + malformed, "query": query,
            "values": request.POST.getlist("run")[:BULK_MAX]})
    tally = {"done": 0, "not_found": malformed, "refused": {}}
    for run_id in ids:
        try:
            run_or_404(run_id)  # another tenant's run is not in this schema: not found
            if action == "cancel":
                services.run_cancel(run_id=run_id, by=request.member.actor)
            else:
                services.run_requeue(run_id=run_id, by=request.member.actor)
            tally["done"] += 1
        except ServiceError as exc:
            if exc.code == "not_found":
                tally["not_found"] += 1
            else:
                tally["refused"].setdefault(exc.message, 0)
                tally["refused"][exc.message] += 1
    _report(request, done, tally)
    return _back_to_list(tenant, query)


def _report(request, done: str, tally: dict) -> None:
    if tally["done"]:
        messages.success(request, f"{tally['done']} {_runs(tally['done'])} {done}.")
    for reason, count in sorted(tally["refused"].items()):
        messages.error(request, f"{count} {_runs(count)} not {done}: {reason}.")
    if tally["not_found"]:
        messages.error(request, f"{tally['not_found']} {_runs(tally['not_found'])} not found.")


def _runs(count: int) -> str:
    return "run" if count == 1 else "runs"


# -- start a run -----------------------------------------------------------------------------

def _latest_agents() -> dict:
    """Each agent's latest version, by name (older versions stay registered while runs drain):
    the platform's and this tenant's own, less those retired (they start no new runs)."""
    startable = {row.name: row.version for row in definitions_latest()}
    latest = {}
    for agent in registry.available():  # sorted by (name, version): the last one wins
        if agent.kind == "tenant" and startable.get(agent.name, 0) < agent.version:
            continue
        latest[agent.name] = agent
    return dict(sorted(latest.items()))


def _example(agent) -> str:
    return json.dumps(agent.input_example if agent and agent.input_example is not None else {},
                      indent=2)


class StartRunForm(forms.Form):
    agent = forms.ChoiceField()
    version = forms.IntegerField(required=False, min_value=1, max_value=2_147_483_647,
                                 help_text="Empty: the latest version.")
    durability = forms.ChoiceField(choices=Run.Durability.choices, initial=Run.Durability.SYNC)
    input = forms.CharField(required=False, label="Input (JSON)",
                            widget=forms.Textarea(attrs={"rows": 12, "spellcheck": "false"}),
                            help_text="A JSON object; the agent's input schema is checked.")
    idempotency_key = forms.UUIDField(widget=forms.HiddenInput)

    def __init__(self, *args, agents: dict, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["agent"].choices = [
            (name, f"{name} (v{agent.version})") for name, agent in agents.items()]
        # the help text is referenced by the input, so screen readers read it
        self.fields["input"].widget.attrs["aria-describedby"] = "id_input_help"

    def clean_input(self) -> dict:
        text = self.cleaned_data["input"].strip()
        if not text:
            return {}
        value = json_typed(text)
        if not isinstance(value, dict):
            raise ValidationError("The input must be a JSON object ({…}).")
        return value


@tenant_page(RUNS_WRITE)
def start_run(request, tenant):
    agents = _latest_agents()
    if request.method == "POST":
        form = StartRunForm(request.POST, agents=agents)
        if form.is_valid():
            data = form.cleaned_data
            try:
                started = services.run_start(
                    agent=data["agent"], version=data["version"], input=data["input"],
                    durability=data["durability"], idempotency_key=str(data["idempotency_key"]),
                    by=request.member.actor)
            except ServiceError as exc:
                _service_error_on(form, exc)
            else:
                run = started.run
                if started.created:
                    messages.success(request, f"Started {run.agent} v{run.agent_version}.")
                else:
                    messages.info(request, "This form was already sent: here is the run it "
                                           "started.")
                return redirect("dashboard:run", tenant, run.id)
        chosen = agents.get(request.POST.get("agent", ""))
    else:
        chosen = agents.get(request.GET.get("agent", "")) or next(iter(agents.values()), None)
        form = StartRunForm(agents=agents, initial={
            "agent": chosen.name if chosen else None, "input": _example(chosen),
            "idempotency_key": uuid.uuid4()})
    return render(request, "dashboard/runs/start.html", {
        "section": "runs", "form": form, "chosen": chosen,
        "schema": json.dumps(chosen.input_schema, indent=2) if chosen and chosen.input_schema
        else None,
        "examples": {name: _example(agent) for name, agent in agents.items()}})


def _service_error_on(form: StartRunForm, exc: ServiceError) -> None:
    """Put the service's refusal next to the field it is about; the typed text stays."""
    if exc.code == "invalid_input" or exc.code == "state_too_large":
        form.add_error("input", exc.message)
    elif exc.code == "unknown_agent":
        form.add_error("version", exc.message)
    elif exc.code == "idempotency_key_reused":
        # the form was sent before with other values: a new key lets this one start a run
        form.data = form.data.copy()
        form.data["idempotency_key"] = str(uuid.uuid4())
        form.add_error(None, "This form was already used to start a run with other values. "
                             "Send it again to start another run.")
    else:
        form.add_error(None, exc.message)


urlpatterns = [
    path("runs", runs, name="runs"),
    path("runs/bulk", runs_bulk, name="runs_bulk"),
    path("runs/start", start_run, name="run_start"),
]
