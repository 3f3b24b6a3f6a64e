"""A tenant agent's run as its conversation (the Run page's "Conversation" panel): the run's
append-only `messages` log (runs/definitions/runner.py) turn by turn, up to the run's latest
checkpoint, each message with the step visit that wrote it, each assistant reply linked to its
model turn (the effect "turn" of the visit that ran it) and each tool call to its effect
("tool:<call id>") and to the message that answers it.

A selector of the dashboard's own: the log's entries carry the visit that appended them, which
runs.services.checkpoint_state leaves out and the links need."""

from dataclasses import dataclass, field
from typing import Any

from runs.definitions.runner import MESSAGES
from runs.effects.models import Effect
from runs.models import Checkpoint, LogEntry, Run

SHOWN = 300  # the newest messages; older ones open one by one by index
CUT = 800  # characters of a message's content shown in the list; the rest on its own page
ARGUMENTS_CUT = 300


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str  # as the model wrote them (JSON text), cut to ARGUMENTS_CUT
    effect: Effect | None = None
    result: int | None = None  # index of the tool message that answers it


@dataclass
class Message:
    index: int
    visit: int  # the checkpoint visit its step wrote
    role: str
    content: str
    name: str = ""  # a tool result's tool
    tool_call_id: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    turn: Effect | None = None  # an assistant reply's model call
    call: int | None = None  # a tool result: index of the assistant message that asked

    @property
    def short(self) -> str:
        return self.content if len(self.content) <= CUT else self.content[:CUT] + " …"

    @property
    def cut(self) -> bool:
        return len(self.content) > CUT


@dataclass
class Conversation:
    messages: list[Message]
    total: int  # entries in the log up to the latest checkpoint

    @property
    def hidden(self) -> int:
        return self.total - len(self.messages)


def messages_length(run: Run) -> int:
    """How many messages the run's latest checkpoint holds."""
    latest = Checkpoint.objects.filter(run=run).order_by("-visit").only("log_offsets").first()
    return int((latest.log_offsets or {}).get(MESSAGES, 0)) if latest else 0


def message_of(run: Run, index: int) -> Message | None:
    """One message by its index in the log, or None past the latest checkpoint's end."""
    if not 0 <= index < messages_length(run):
        return None
    entry = LogEntry.objects.filter(run=run, log=MESSAGES, index=index).first()
    return None if entry is None else _message(entry)


def conversation_of(run: Run, *, shown: int = SHOWN) -> Conversation:
    total = messages_length(run)
    entries = LogEntry.objects.filter(run=run, log=MESSAGES, index__gte=max(0, total - shown),
                                      index__lt=total).order_by("index")
    messages = [_message(entry) for entry in entries]
    turns = {effect.scope: effect for effect in Effect.objects.filter(run=run, name="turn")}
    calls: dict[str, list[Effect]] = {}
    for effect in Effect.objects.filter(run=run, name__startswith="tool:"):
        calls.setdefault(effect.name, []).append(effect)
    for position, message in enumerate(messages):
        if message.role != "assistant":
            continue
        message.turn = turns.get(str(message.visit - 1))  # the turn step ran at the visit before
        for call in message.tool_calls:
            call.effect = _first_from(calls.get(f"tool:{call.id}", []), message.visit - 1)
            answer = next((m for m in messages[position + 1:]
                           if m.role == "tool" and m.tool_call_id == call.id), None)
            if answer is not None:
                call.result, answer.call = answer.index, message.index
    return Conversation(messages=messages, total=total)


def _first_from(effects: list[Effect], visit: int) -> Effect | None:
    """The effect recorded first at or after `visit` (a model may reuse a call id in a later
    turn; each turn's call is answered after it). Scopes are "7" or a branch's "7/b3"."""
    later = [(int(e.scope.split("/")[0]), e.id, e) for e in effects
             if e.scope.split("/")[0].isdigit() and int(e.scope.split("/")[0]) >= visit]
    return min(later, key=lambda t: t[:2])[2] if later else None


def _text(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else str(value)


def _message(entry: LogEntry) -> Message:
    value = entry.value if isinstance(entry.value, dict) else {"role": "?", "content": entry.value}
    calls = []
    for raw in value.get("tool_calls") or []:
        function = raw.get("function") or {} if isinstance(raw, dict) else {}
        arguments = _text(function.get("arguments"))
        calls.append(ToolCall(id=_text(raw.get("id")) if isinstance(raw, dict) else "",
                              name=_text(function.get("name")),
                              arguments=arguments if len(arguments) <= ARGUMENTS_CUT
                              else arguments[:ARGUMENTS_CUT] + " …"))
    return Message(index=entry.index, visit=entry.visit, role=_text(value.get("role")),
                   content=_text(value.get("content")), name=_text(value.get("name")),
                   tool_call_id=_text(value.get("tool_call_id")), tool_calls=calls)
