"""A run's timeline: its step visits and parked spans over wall time, retries and effects as
marks, child runs and fan-out branches as lanes of their own; drawn as inline SVG on the server
(no script), with the same spans as rows for a text alternative.

The spans come from the checkpoints (visit v's step runs from checkpoint v to checkpoint v + 1;
a checkpoint written by a wake-up closes a parked span instead), the run's end, and its events.
"""

from dataclasses import dataclass
from datetime import datetime

from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe

from runs.effects.models import Effect
from runs.models import Branch, Checkpoint, Run, RunEvent

# What wakes a parked run (the session log's kinds): where a parked span ends.
WAKE_KINDS = frozenset({"approval_decided", "event_received", "timer_fired", "wait_timed_out",
                        "fan_in", "operator_requeued", "run_migrated"})
MAX_RUN_SPANS = 400
MAX_CHILD_LANES = 20
MAX_BRANCH_LANES = 30
WIDTH, LABELS, LANE, AXIS, PAD = 960, 170, 28, 28, 12


@dataclass
class Span:
    lane: str
    kind: str  # step, parked, child, branch
    label: str
    start: datetime
    end: datetime
    status: str  # done, running, waiting, failed, succeeded, cancelled, ...
    visit: int | None = None
    link_run: str = ""  # a child run's id

    @property
    def seconds(self) -> float:
        return max(0.0, (self.end - self.start).total_seconds())


@dataclass
class Mark:
    lane: str
    kind: str  # retry, effect
    label: str
    at: datetime
    status: str = ""


@dataclass
class Timeline:
    lanes: list[str]
    spans: list[Span]
    marks: list[Mark]
    start: datetime
    end: datetime
    more_lanes: int = 0  # lanes left out (too many children or branches)
    hidden_spans: int = 0  # the run's earliest spans, left out of a long run

    @property
    def empty(self) -> bool:
        return not self.spans


def duration(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes, sec = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {sec} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min"
    return f"{hours // 24} d {hours % 24} h"


def _parked_label(checkpoint: Checkpoint) -> str:
    waiting = checkpoint.waiting or {}
    return waiting.get("reason") or f"waiting ({waiting.get('kind', 'parked')})"


def timeline_of(run: Run, *, now: datetime | None = None) -> Timeline:
    now = now or timezone.now()
    end_of_run = run.finished_at or now
    checkpoints = list(Checkpoint.objects.filter(run=run).defer("state", "log_offsets")
                       .order_by("visit"))
    events = list(RunEvent.objects.filter(run=run).order_by("id"))
    spans, marks = [], []
    lane = "this run"
    for index, checkpoint in enumerate(checkpoints):
        after = checkpoints[index + 1] if index + 1 < len(checkpoints) else None
        if after is not None:
            if (after.waiting or {}).get("woken_from") is not None:
                spans.append(Span(lane, "parked", _parked_label(checkpoint), checkpoint.created_at,
                                  after.created_at, "waited", checkpoint.visit))
                continue
            begun = checkpoint.created_at
            if (checkpoint.waiting or {}).get("kind"):  # parked here, woken without a checkpoint
                woke = next((e.created_at for e in events if e.kind in WAKE_KINDS
                             and checkpoint.created_at <= e.created_at <= after.created_at), None)
                if woke is not None:
                    spans.append(Span(lane, "parked", _parked_label(checkpoint), begun, woke,
                                      "waited", checkpoint.visit))
                    begun = woke
            spans.append(Span(lane, "step", checkpoint.step or "?", begun, after.created_at,
                              "done", checkpoint.visit))
            continue
        if checkpoint.step is None:  # the run's end
            continue
        parked = checkpoint.waiting and "woken_from" not in checkpoint.waiting
        if run.status == Run.Status.WAITING or (parked and run.is_finished):
            status = "waiting" if run.status == Run.Status.WAITING else run.status
            label = _parked_label(checkpoint) if parked else (run.waiting_reason or "parked")
            spans.append(Span(lane, "parked", label, checkpoint.created_at, end_of_run, status,
                              checkpoint.visit))
        elif run.status == Run.Status.QUEUED:
            spans.append(Span(lane, "step", f"{checkpoint.step} (queued)", checkpoint.created_at,
                              now, "queued", checkpoint.visit))
        else:
            spans.append(Span(lane, "step", checkpoint.step, checkpoint.created_at, end_of_run,
                              run.status, checkpoint.visit))
    for event in events:
        if event.kind == "step_error":
            again = "will retry" if event.data.get("will_retry") else "no retry left"
            marks.append(Mark(lane, "retry", f"{event.data.get('step', '')} attempt "
                              f"{event.data.get('attempt', '?')} failed ({again})", event.created_at,
                              "failed"))
    for effect in Effect.objects.filter(run=run).order_by("id"):
        marks.append(Mark(lane, "effect", f"effect {effect.name} ({effect.connector}): "
                          f"{effect.status}", effect.created_at, effect.status))

    hidden = max(0, len(spans) - MAX_RUN_SPANS)  # a long loop: its latest visits
    spans = spans[hidden:]
    if spans:
        marks = [m for m in marks if m.at >= spans[0].start]
    lanes, more = [lane], 0
    children = list(Run.objects.filter(parent=run).order_by("created_at"))
    more += max(0, len(children) - MAX_CHILD_LANES)
    for child in children[:MAX_CHILD_LANES]:
        name = f"child {child.agent}"
        lanes.append(name)
        spans.append(Span(name, "child", f"{child.agent} v{child.agent_version}: {child.status}",
                          child.created_at, child.finished_at or now, child.status,
                          link_run=str(child.id)))
    branches = list(Branch.objects.filter(run=run).order_by("visit", "index"))
    more += max(0, len(branches) - MAX_BRANCH_LANES)
    for branch in branches[:MAX_BRANCH_LANES]:
        name = f"branch {branch.visit}/{branch.index}"
        lanes.append(name)
        spans.append(Span(name, "branch", f"{branch.step} #{branch.index}: {branch.status}",
                          branch.created_at, branch.finished_at or now, branch.status,
                          branch.visit))
    times = [s.start for s in spans] + [s.end for s in spans] + [m.at for m in marks]
    start = min(times, default=run.created_at)
    end = max(times, default=end_of_run)
    return Timeline(lanes=lanes, spans=spans, marks=marks, start=start, end=end, more_lanes=more,
                    hidden_spans=hidden)


def _fill(span: Span) -> str:
    if span.kind == "parked":
        return "url(#parked)"
    return {"failed": "#b42318", "cancelled": "#b54708", "running": "#1d4ed8",
            "queued": "#98a2b3", "pending": "#98a2b3", "waiting": "#6d28d9"}.get(span.status,
                                                                                 "#2e5aac")


def _n(number: float) -> str:
    return f"{number:.1f}"  # format_html escapes its arguments to strings: format them first


def timeline_svg(timeline: Timeline, *, title: str = "Timeline") -> SafeString:
    """The timeline as an SVG: lanes down, time across; every shape carries a <title>."""
    total = max((timeline.end - timeline.start).total_seconds(), 0.001)
    plot = WIDTH - LABELS - PAD
    height = AXIS + LANE * len(timeline.lanes) + PAD

    def x(at: datetime) -> float:
        return LABELS + (at - timeline.start).total_seconds() / total * plot

    row = {name: AXIS + LANE * i for i, name in enumerate(timeline.lanes)}
    parts = [format_html(
        '<svg class="timeline-svg" viewBox="0 0 {} {}" role="img" aria-labelledby="tl-title" '
        'xmlns="http://www.w3.org/2000/svg"><title id="tl-title">{}</title>'
        '<defs><pattern id="parked" width="6" height="6" patternUnits="userSpaceOnUse" '
        'patternTransform="rotate(45)"><rect width="6" height="6" fill="#ede9fe"/>'
        '<line x1="0" y1="0" x2="0" y2="6" stroke="#6d28d9" stroke-width="3"/></pattern></defs>',
        WIDTH, height, title)]
    for i in range(5):  # the time axis: five ticks from the first span to the last
        tick = LABELS + plot * i / 4
        parts.append(format_html(
            '<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="#d6dae0"/>'
            '<text x="{}" y="16" font-size="11" fill="#545d68" text-anchor="{}">+{}</text>',
            _n(tick), AXIS - 6, _n(tick), height - PAD, _n(tick), "start" if i == 0 else "end" if i == 4
            else "middle", duration(total * i / 4)))
    for name, top in row.items():
        parts.append(format_html(
            '<text x="4" y="{}" font-size="12" fill="#1b1f24">{}</text>', top + 17, name[:24]))
    for span in timeline.spans:
        left = x(span.start)
        width = max(2.0, x(span.end) - left)
        parts.append(format_html(
            '<rect class="span span-{}" x="{}" y="{}" width="{}" height="{}" rx="2" '
            'fill="{}" stroke="{}"><title>{} ({}, {}), {}</title></rect>',
            span.kind, _n(left), row[span.lane] + 4, _n(width), LANE - 8, _fill(span),
            "#6d28d9" if span.kind == "parked" else "none", span.label, span.kind, span.status,
            duration(span.seconds)))
    for mark in timeline.marks:
        at, top = x(mark.at), row[mark.lane]
        if mark.kind == "retry":
            parts.append(format_html(
                '<path class="mark mark-retry" d="M{} {} l5 9 h-10 z" fill="#f79009" '
                'stroke="#7a2e0e"><title>retry: {}</title></path>', _n(at), top + 1, mark.label))
        else:
            colour = {"done": "#067647", "failed": "#b42318", "unknown": "#b54708"}.get(
                mark.status, "#545d68")
            parts.append(format_html(
                '<path class="mark mark-effect" d="M{} {} l5 5 l-5 5 l-5 -5 z" fill="{}" '
                'stroke="#fff"><title>{}</title></path>', _n(at), top + LANE - 12, colour, mark.label))
    parts.append(mark_safe("</svg>"))
    return mark_safe("".join(parts))
