"""A run's situation, as the Run page's header tells it: may it continue (and why it waits),
what runs next, which artifacts were approved and by whom, whether each outside effect
happened, and why it failed. Reads through the runs core's selectors and models; decides
nothing and writes nothing."""

from dataclasses import dataclass, field
from datetime import datetime

from django.db import connection
from django.db.models import Q

from runs.approvals.models import Approval, EventGate
from runs.approvals.selectors import approval_list
from runs.dispatch.models import Wakeup
from runs.effects.models import Effect
from runs.effects.selectors import effect_list
from runs.models import Branch, Checkpoint, Run, RunEvent

ERROR_SHORT = 300  # characters of an error the header shows; the rest is behind <details>

# Session-log kinds that say something went wrong, and those that park or wake a run.
FAILURE_KINDS = frozenset({
    "step_error", "step_failed", "run_failed", "engine_error", "poison_step", "resume_refused",
    "budget_exceeded", "lease_expired", "agent_unknown_here", "limit_exceeded"})
WAIT_KINDS = frozenset({
    "run_parked", "approval_requested", "approval_decided", "event_received", "timer_fired",
    "fan_out", "fan_in", "approval_expired", "gate_expired", "child_run"})


@dataclass
class Wait:
    """What a waiting run waits for. `kind`: approval, event, timer, child_run, fan_out, or
    person (parked by the platform for someone to look: refused code, a poison step)."""

    kind: str
    reason: str = ""
    approval: Approval | None = None
    gate: EventGate | None = None
    due_at: datetime | None = None
    since: datetime | None = None
    expires_at: datetime | None = None
    then: str = ""
    on_timeout: str = ""
    child: Run | None = None
    branches: dict[str, int] = field(default_factory=dict)


@dataclass
class EffectLine:
    """One ledger row in words: `outcome` is what a person reads; `approval` is the one that
    asks a person about an effect of unknown outcome."""

    effect: Effect
    outcome: str
    approval: Approval | None = None


@dataclass
class Failure:
    step: str
    visit: int | None
    error: str
    short: str
    traceback: str = ""

    @property
    def trimmed(self) -> bool:
        return self.short != self.error


@dataclass
class Situation:
    run: Run
    continues: str  # "May it continue?" in one sentence
    wait: Wait | None
    next_step: str | None
    next_words: str
    decided: list[Approval]
    effects: list[EffectLine]
    failure: Failure | None
    latest: Checkpoint | None


def trim(text: str, limit: int = ERROR_SHORT) -> str:
    """The first `limit` characters, cut at a word where one is near, with an ellipsis."""
    text = text.strip()
    if len(text) <= limit:
        return text
    cut = text[:limit]
    space = cut.rfind(" ")
    return (cut[:space] if space > limit * 0.6 else cut).rstrip() + " …"


def wait_of(run: Run, latest: Checkpoint | None) -> Wait | None:
    """What the run waits for now; None unless it is waiting."""
    if run.status != Run.Status.WAITING:
        return None
    reason = run.waiting_reason
    approval = approval_list(status=Approval.Status.PENDING, run_id=run.id).first()
    if approval is not None:
        return Wait("approval", reason, approval=approval, expires_at=approval.expires_at,
                    since=approval.created_at, then=approval.then,
                    on_timeout=approval.on_timeout)
    gate = EventGate.objects.filter(run=run, status=EventGate.Status.OPEN).first()
    if gate is not None and gate.kind == "child_run":
        child = Run.objects.filter(id=gate.key).first()
        return Wait("child_run", reason, gate=gate, child=child, since=gate.created_at,
                    then=gate.then)
    if gate is not None:
        return Wait("event", reason, gate=gate, since=gate.created_at,
                    expires_at=gate.expires_at, then=gate.then, on_timeout=gate.on_timeout)
    visit = latest.visit if latest else None
    branches = Branch.objects.filter(run=run, visit=visit) if visit is not None else None
    if branches is not None and branches.exists():
        counts: dict[str, int] = {}
        for status in branches.values_list("status", flat=True):
            counts[status] = counts.get(status, 0) + 1
        return Wait("fan_out", reason, branches=counts, then=latest.step or "")
    wakeup = (Wakeup.objects.filter(schema_name=connection.schema_name, run_id=run.id, visit=visit)
              .first() if visit is not None else None)  # the public table: this tenant's only
    if wakeup is not None:
        return Wait("timer", reason, due_at=wakeup.due_at, then=latest.step or "")
    return Wait("person", reason, then=latest.step if latest and latest.step else "")


def _continues(run: Run, wait: Wait | None) -> str:
    match run.status:
        case Run.Status.QUEUED:
            return "Yes: it is in line for a worker."
        case Run.Status.RUNNING if run.cancel_requested:
            return "It is stopping: a cancel was asked for; it ends when the running step does."
        case Run.Status.RUNNING:
            return "Yes: a worker is running it now."
        case Run.Status.WAITING if wait is not None and wait.kind == "person":
            return "Not by itself: the platform parked it for a person to look at."
        case Run.Status.WAITING:
            return "Not yet: it is parked, and continues when what it waits for arrives."
        case Run.Status.SUCCEEDED:
            return "No need: it finished successfully."
        case Run.Status.FAILED:
            return "No: it failed. It can be migrated to a newer version or forked."
        case Run.Status.CANCELLED:
            return "No: it was cancelled."
    return run.status


def _next(run: Run, wait: Wait | None, latest: Checkpoint | None) -> tuple[str | None, str]:
    """The step the run resumes at and a sentence saying when."""
    if run.is_finished:
        return None, "Nothing: the run has ended."
    if wait is not None and wait.then:
        words = {"approval": "when the approval is decided",
                 "event": "when the event arrives",
                 "timer": "when the timer is due",
                 "child_run": "when the child run ends",
                 "fan_out": "once every branch has a result",
                 "person": "once a person re-queues or migrates it"}[wait.kind]
        if wait.on_timeout:
            words += f" (if it times out: {wait.on_timeout})"
        return wait.then, words
    step = latest.step if latest else None
    if step is None:
        return None, "Nothing: its last checkpoint is its end."
    return step, "next, from its latest checkpoint"


def _effect_lines(run: Run) -> list[EffectLine]:
    asks = [a for a in approval_list(run_id=run.id).filter(kind=Approval.Kind.EFFECT_OUTCOME)
            .order_by("created_at")]
    lines = []
    for effect in effect_list(run_id=run.id):
        ask = next((a for a in reversed(asks) if a.request.get("scope") == effect.scope
                    and a.request.get("effect") == effect.name), None)
        match effect.status:
            case Effect.Status.DONE:
                outcome = "Happened."
            case Effect.Status.FAILED:
                outcome = f"Failed: {trim(effect.error, 160)}" if effect.error else "Failed."
            case Effect.Status.UNKNOWN:
                outcome = (f"Outcome unknown: the call may or may not have reached "
                           f"{effect.connector}, which cannot be asked. A person must say whether "
                           f"it arrived before the run goes on.")
            case _:
                outcome = ("Started, no answer recorded yet"
                           + (" (an earlier attempt may have been sent)." if effect.maybe_sent
                              else "."))
        lines.append(EffectLine(effect, outcome, ask))
    return lines


def _failure(run: Run) -> Failure | None:
    """The step the run failed in and its error. The run's end event names the visit: a step
    whose retries ran out (or that broke a rule) ends at its own visit, a step that chose to
    fail at the next one, whose checkpoint is the end."""
    if run.status != Run.Status.FAILED:
        return None
    ended = RunEvent.objects.filter(run=run, kind__in=("run_failed", "limit_exceeded")) \
        .order_by("-id").first()
    visit = ended.visit if ended else None
    error = run.error or (ended.data.get("error", "") if ended else "") or "No error was recorded."
    step, traceback = "", ""
    if visit is not None:
        step_event = RunEvent.objects.filter(run=run, visit=visit, kind__in=(
            "step_failed", "step_error")).order_by("-id").first()
        if step_event is not None:
            step, traceback = step_event.data.get("step", ""), step_event.data.get("traceback", "")
        else:
            at = Checkpoint.objects.filter(run=run, visit=visit).values_list("step", flat=True).first()
            if at is None and visit > 0:  # the end's checkpoint: the step ran from the one before
                visit -= 1
                at = Checkpoint.objects.filter(run=run, visit=visit).values_list(
                    "step", flat=True).first()
            step = at or ""
    return Failure(step=step, visit=visit, error=error, short=trim(error), traceback=traceback)


def situation_of(run: Run) -> Situation:
    latest = run.checkpoints.order_by("-visit").first()
    wait = wait_of(run, latest)
    next_step, next_words = _next(run, wait, latest)
    decided = list(approval_list(run_id=run.id).exclude(status=Approval.Status.PENDING)
                   .order_by("decided_at", "created_at"))
    return Situation(run=run, continues=_continues(run, wait), wait=wait, next_step=next_step,
                     next_words=next_words, decided=decided, effects=_effect_lines(run),
                     failure=_failure(run), latest=latest)


def event_filter(events, *, show: str, step: str = "", visits_of_step: set[int] | None = None):
    """The session log, narrowed: `show` is all, failures, waits or step (with `step`)."""
    match show:
        case "failures":
            return events.filter(kind__in=FAILURE_KINDS)
        case "waits":
            return events.filter(kind__in=WAIT_KINDS)
        case "step" if step:
            return events.filter(Q(data__step=step) | Q(visit__in=visits_of_step or set()))
    return events
