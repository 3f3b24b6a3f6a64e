"""The Run page (`t/<tenant>/runs/<run_id>`): the header that says where the run stands (it
refreshes itself while the run is unfinished), the steps picture, the timeline, the session
log, effects and outbox, checkpoints (state at each, a diff between two), and the actions a
role may take: cancel, re-queue, migrate, fork, and sending the event the run waits for.

Reads come from runs.selectors (and the dashboard's situation/timeline readers built on the
models), writes from runs.services and runs.approvals.services, as the API's do."""

import uuid
from collections import Counter

from django import forms
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import path, reverse
from django.views.decorators.http import require_POST

from agentplatform.db import retried_on_conflict
from agentplatform.errors import ServiceError
from runs import services
from runs.agents import UnknownAgent, registry
from runs.approvals.services import event_submit
from runs.definitions.selectors import definition_versions
from runs.effects.selectors import outbox_list
from runs.models import Branch, Run
from runs.selectors import checkpoint_list, run_event_list, run_or_404
from tenants.people import audit_record
from tenants.roles import APPROVALS_DECIDE, RUNS_WRITE

from ..access import tenant_page
from ..conversation import conversation_of, message_of
from ..diffs import json_diff
from ..pictures import PictureError, steps_svg
from ..situation import event_filter, situation_of
from ..timeline import duration, timeline_of, timeline_svg
from ..typed_json import json_shown, json_typed

LOG_SHOWS = {"all": "All events", "failures": "Failures only", "waits": "Waits only",
             "step": "One step"}
LOG_LIMIT = 500  # the newest this many; the API pages through the rest
CHECKPOINTS_SHOWN = 300  # the latest; any visit can still be opened and compared by URL


class EventForm(forms.Form):
    payload = forms.CharField(
        label="Payload (a JSON object)", required=False, initial="{}",
        widget=forms.Textarea(attrs={"rows": 5, "spellcheck": "false"}),
        help_text="What the run reads as <code>state.event.payload</code>.")
    # This form's sending, once: the event's dedupe id (source_id). A double click, a second
    # tab or a retry after a lost answer sends the same id, and the event is not delivered
    # again (to the run's next wait for the same key). Missing only in a page older than it.
    event_id = forms.UUIDField(required=False, widget=forms.HiddenInput)

    def clean_payload(self):
        text = self.cleaned_data["payload"].strip() or "{}"
        value = json_typed(text)
        if not isinstance(value, dict):
            raise forms.ValidationError("The payload must be a JSON object ({...}).")
        return value


def _run(run_id) -> Run:
    """This tenant's run or 404: another tenant's id is simply not in this schema."""
    try:
        return run_or_404(run_id)
    except ServiceError:
        raise Http404("No such run.") from None


def _newer_versions(run: Run) -> list[int]:
    # the platform's versions and, for a tenant agent, its definition's newer ones not retired
    retired = set(definition_versions(name=run.agent).filter(retired_at__isnull=False)
                  .values_list("version", flat=True))
    return [a.version for a in registry.available()
            if a.name == run.agent and a.version > run.agent_version
            and not (a.kind == "tenant" and a.version in retired)]


def _header_context(request, tenant, run: Run) -> dict:
    situation = situation_of(run)
    approval = situation.wait.approval if situation.wait else None
    # As approval_decide checks it: the role decides, and the person is among the deciders
    member = request.member
    you_decide = approval is not None and member.may(APPROVALS_DECIDE) and (
        not approval.deciders or bool(set(member.identities) & set(approval.deciders)))
    return {"tenant": tenant, "run": run, "s": situation, "live": not run.is_finished,
            "you_decide": you_decide,
            # the status the page was loaded with; anything else would put words of the
            # link's author on the page ("it was <their text> when this page was loaded")
            "seen": seen if (seen := request.GET.get("seen")) in Run.Status.values
            else run.status,
            "header_url": reverse("dashboard:run_header", args=[tenant, run.id])}


def _path(run: Run, checkpoints) -> list[str]:
    """The steps the run took, in visit order: each checkpoint's next step ran, except where
    the next checkpoint is a wake-up's (that step runs from the wake-up's checkpoint), and the
    latest checkpoint's only if it is running or failed there (else it is yet to run)."""
    taken = []
    for index, checkpoint in enumerate(checkpoints):
        after = checkpoints[index + 1] if index + 1 < len(checkpoints) else None
        if not checkpoint.step:
            continue
        if after is None:
            if run.status in (Run.Status.RUNNING, Run.Status.FAILED):
                taken.append(checkpoint.step)
        elif (after.waiting or {}).get("woken_from") is None:
            taken.append(checkpoint.step)
    return taken


def _steps_picture(run: Run, path: list[str], next_step: str | None) -> tuple[str, str]:
    """The agent's steps with this run on them (pictures.steps_svg), or why there is none."""
    try:
        agent = registry.get(run.agent, run.agent_version)
    except UnknownAgent:
        return "", f"{run.agent} v{run.agent_version} is not registered here any more."
    statuses = dict.fromkeys(path, "done")
    current = None
    if run.status == Run.Status.FAILED and path:
        statuses[path[-1]] = "failed"
    elif run.status == Run.Status.RUNNING and path:
        current = path[-1]
        statuses[current] = "current"
    elif run.status in (Run.Status.WAITING, Run.Status.QUEUED) and next_step:
        current = next_step
        statuses[current] = "waiting" if run.status == Run.Status.WAITING else "current"
    visits = Counter(path)
    for branch in Branch.objects.filter(run=run):  # a fan-out's branches visit its step
        visits[branch.step] += 1
        if branch.status == Branch.Status.FAILED:
            statuses[branch.step] = "failed"
        elif branch.status == Branch.Status.DONE:
            statuses.setdefault(branch.step, "done")
        else:
            statuses[branch.step] = "current"
    try:
        return steps_svg(agent, visits=dict(visits), current=current, statuses=statuses,
                         path=list(zip(path, path[1:], strict=False)),
                         title=f"Steps of {run.agent} v{run.agent_version} for this run"), ""
    except PictureError:
        return "", "The picture could not be drawn (Graphviz failed); the path is below."


def _is_tenant_agent(run: Run) -> bool:
    """A run of one of the tenant's definitions: its conversation is the page's to show."""
    try:
        return registry.get(run.agent, run.agent_version).kind == "tenant"
    except UnknownAgent:
        return False


def _diff(request, run: Run, visits: list[int]) -> dict:
    """The diff the person asked for (?a=&b=), or why not."""
    a, b = request.GET.get("a"), request.GET.get("b")
    if a is None or b is None:
        return {}
    try:
        a, b = int(a), int(b)
    except ValueError:
        return {"diff_error": "Choose two checkpoints by their visit number."}
    if a not in visits or b not in visits:
        return {"diff_error": "The run has no checkpoint at one of those visits.", "diff_a": a,
                "diff_b": b}
    before = services.checkpoint_state(run_id=run.id, visit=a)
    after = services.checkpoint_state(run_id=run.id, visit=b)
    pick = ("step", "state", "logs")
    try:
        diff = json_diff({k: before[k] for k in pick}, {k: after[k] for k in pick})
    except RecursionError:  # json_diff recurses per level; a stored state may nest very deep
        return {"diff_error": "These states are nested too deeply to compare here.",
                "diff_a": a, "diff_b": b}
    return {"diff_a": a, "diff_b": b, "diff": diff}


def _page(request, tenant, run: Run, *, event_form: EventForm | None = None, status: int = 200):
    # the states are read one at a time, on demand (checkpoint_state)
    checkpoints = list(checkpoint_list(run_id=run.id).defer("state", "log_offsets")
                       .order_by("visit"))
    shown = checkpoints[-CHECKPOINTS_SHOWN:]
    visits = [c.visit for c in checkpoints]
    steps_at = {c.visit: c.step for c in checkpoints}
    show = request.GET.get("log", "all")
    show = show if show in LOG_SHOWS else "all"
    step = request.GET.get("step", "")
    if "\x00" in step:  # no step is named so, and PostgreSQL cannot compare jsonb with it (a 500)
        step = ""
    events = run_event_list(run_id=run.id).order_by("id")
    logged = event_filter(events, show=show, step=step,
                          visits_of_step={v for v, s in steps_at.items() if s == step})
    logged = list(logged.order_by("-id")[:LOG_LIMIT])[::-1]  # the newest, oldest first
    timeline = timeline_of(run)
    header = _header_context(request, tenant, run)
    conversation = conversation_of(run) if _is_tenant_agent(run) else None
    path_taken = _path(run, checkpoints)
    picture, no_picture = _steps_picture(run, path_taken, header["s"].next_step)
    context = {
        **header,
        "steps_picture": picture, "no_picture": no_picture,
        "section": "runs",
        "checkpoints": shown, "checkpoints_hidden": len(checkpoints) - len(shown),
        "steps": sorted({s for s in steps_at.values() if s}),
        "path": path_taken,
        "log_shows": LOG_SHOWS, "log_show": show, "log_step": step, "log": logged,
        "log_total": events.count(),
        "outbox": outbox_list(run_id=run.id).order_by("id"),
        "timeline": timeline,
        "timeline_svg": timeline_svg(timeline, title=f"Timeline of run {run.id}"),
        "timeline_length": duration((timeline.end - timeline.start).total_seconds()),
        "timeline_rows": [(span, duration(span.seconds)) for span in timeline.spans],
        "children": list(run.children.order_by("created_at")),
        "newer_versions": _newer_versions(run),
        "forkable": [c for c in checkpoints if c.step is not None],
        "fork_key": uuid.uuid4(),
        "event_form": event_form or EventForm(initial={"event_id": uuid.uuid4()}),
        "conversation": conversation,
        **_diff(request, run, visits),
    }
    return render(request, "dashboard/run/page.html", context, status=status)


@tenant_page()
def run_page(request, tenant, run_id):
    # htmx's log filter asks for the whole page too and swaps in the log panel alone
    return _page(request, tenant, _run(run_id))


@tenant_page()
def run_header(request, tenant, run_id):
    """The header alone, for the 2-second refresh while the run is unfinished."""
    run = _run(run_id)
    return render(request, "dashboard/run/header.html", _header_context(request, tenant, run))


@tenant_page()
def run_checkpoint(request, tenant, run_id, visit):
    """The state at one checkpoint (time travel): a panel for htmx, else a page of its own."""
    run = _run(run_id)
    try:
        state = services.checkpoint_state(run_id=run.id, visit=visit)
    except ServiceError:
        raise Http404("No such checkpoint.") from None
    context = {"tenant": tenant, "run": run, "cp": state, "section": "runs",
               "state_json": json_shown(state["state"], indent=2),
               "logs_json": json_shown(state["logs"], indent=2)}
    template = "dashboard/run/checkpoint_state.html" if request.htmx else \
        "dashboard/run/checkpoint_page.html"
    return render(request, template, context)


@tenant_page()
def run_message(request, tenant, run_id, index):
    """One message of a tenant agent's conversation, whole (the page's list cuts long ones)."""
    run = _run(run_id)
    message = message_of(run, index)
    if message is None:
        raise Http404("No such message.")
    return render(request, "dashboard/run/message.html", {
        "tenant": tenant, "run": run, "message": message, "section": "runs"})


def _done(request, tenant, run_id, action):
    """Run `action()`; a ServiceError becomes a message. Back to the run's page."""
    try:
        outcome = action()
    except ServiceError as exc:
        messages.error(request, f"{exc.message} ({exc.code})")
        return redirect("dashboard:run", tenant, run_id)
    return outcome


@require_POST
@tenant_page(RUNS_WRITE)
def run_cancel(request, tenant, run_id):
    run = _run(run_id)
    if request.POST.get("confirm") != "yes":
        messages.error(request, "Tick the box to confirm that you want to cancel this run.")
        return redirect("dashboard:run", tenant, run.id)

    def cancel():
        services.run_cancel(run_id=run.id, by=request.member.actor)
        messages.success(request, "Cancelled (a running step finishes first).")
        return redirect("dashboard:run", tenant, run.id)

    return _done(request, tenant, run.id, cancel)


@require_POST
@tenant_page(RUNS_WRITE)
def run_requeue(request, tenant, run_id):
    run = _run(run_id)

    def requeue():
        services.run_requeue(run_id=run.id, by=request.member.actor)
        messages.success(request, "Put back in line: it resumes from its latest checkpoint.")
        return redirect("dashboard:run", tenant, run.id)

    return _done(request, tenant, run.id, requeue)


@require_POST
@tenant_page(RUNS_WRITE)
def run_migrate(request, tenant, run_id):
    run = _run(run_id)
    try:
        version = int(request.POST.get("version", ""))
    except ValueError:
        messages.error(request, "Choose the version to migrate to.")
        return redirect("dashboard:run", tenant, run.id)

    def migrate():
        services.run_migrate(run_id=run.id, version=version, by=request.member.actor)
        messages.success(request, f"Migrated to version {version}.")
        return redirect("dashboard:run", tenant, run.id)

    return _done(request, tenant, run.id, migrate)


@require_POST
@tenant_page(RUNS_WRITE)
def run_fork(request, tenant, run_id):
    # As the API: a fork re-opens what its source waited for, so it takes deciding too.
    if not request.member.may(APPROVALS_DECIDE):
        raise PermissionDenied("Forking takes the right to start runs and to decide approvals.")
    run = _run(run_id)
    try:
        visit = int(request.POST.get("visit", ""))
    except ValueError:
        messages.error(request, "Choose the checkpoint to fork from.")
        return redirect("dashboard:run", tenant, run.id)

    # The form's one-time key: a double click or a retry makes one fork, not two (a fork's
    # effects are new ones: a second fork would perform them again).
    key = request.POST.get("fork_key", "")[:100]
    key = f"fork:{key}" if key else None

    def fork():
        again = key is not None and Run.objects.filter(idempotency_key=key).exists()
        forked = services.run_fork(run_id=run.id, visit=visit, by=request.member.actor,
                                   idempotency_key=key)
        if again:
            messages.info(request, "This form already forked the run: here is that fork.")
        else:
            messages.success(request, f"Forked from visit {visit} of run {run.id}.")
        return redirect("dashboard:run", tenant, forked.id)

    return _done(request, tenant, run.id, fork)


@require_POST
@tenant_page(RUNS_WRITE)
def run_event(request, tenant, run_id):
    """Send the event the run waits for (as `POST /api/v1/events`): kind and key are the open
    gate's, never the form's; the payload is the person's."""
    run = _run(run_id)
    wait = situation_of(run).wait
    if wait is None or wait.kind != "event":
        messages.error(request, "This run is not waiting for an event (any more).")
        return redirect("dashboard:run", tenant, run.id)
    form = EventForm(request.POST)
    if not form.is_valid():
        return _page(request, tenant, run, event_form=form, status=400)
    gate = wait.gate

    @retried_on_conflict  # a deadlock victim runs again, as event_deliver's own would
    def deliver_and_record():
        # The event and who sent it commit together: a failure in between leaves neither,
        # and sending the form again delivers it (its dedupe id was not taken).
        with transaction.atomic():
            event_id = form.cleaned_data["event_id"]
            delivery = event_submit(kind=gate.kind, key=gate.key,
                                    payload=form.cleaned_data["payload"],
                                    source_id=f"dashboard:{event_id}" if event_id else None)
            if not delivery.duplicate:
                # The event log records the event, not who sent it: the audit log does.
                audit_record(tenant=request.member.tenant, actor=request.member.actor,
                             action="event.sent", target=f"run:{run.id}", kind=gate.kind,
                             key=gate.key, event=delivery.event.id if delivery.event else None,
                             resumed=[str(r) for r in delivery.resumed])
        return delivery

    def send():
        delivery = deliver_and_record()
        if delivery.duplicate:
            messages.info(request, "This event was already sent from this form: it is not "
                                   "sent again.")
            return redirect("dashboard:run", tenant, run.id)
        woke = run.id in delivery.resumed
        messages.success(request, f"Sent {gate.kind} for {gate.key}"
                         + (": the run goes on." if woke else "; it woke no run."))
        return redirect("dashboard:run", tenant, run.id)

    return _done(request, tenant, run.id, send)


urlpatterns = [
    path("runs/<uuid:run_id>", run_page, name="run"),
    path("runs/<uuid:run_id>/header", run_header, name="run_header"),
    path("runs/<uuid:run_id>/checkpoints/<int:visit>", run_checkpoint, name="run_checkpoint"),
    path("runs/<uuid:run_id>/messages/<int:index>", run_message, name="run_message"),
    path("runs/<uuid:run_id>/cancel", run_cancel, name="run_cancel"),
    path("runs/<uuid:run_id>/requeue", run_requeue, name="run_requeue"),
    path("runs/<uuid:run_id>/migrate", run_migrate, name="run_migrate"),
    path("runs/<uuid:run_id>/fork", run_fork, name="run_fork"),
    path("runs/<uuid:run_id>/event", run_event, name="run_event"),
]
