"""The runner: the one operator agent that interprets a tenant's definition, so a tenant's agent
is data and never Python in a worker. Every version of every definition becomes an `Agent` with
these steps (`runner_agent`); the definition's hash is part of its topology.

    turn ──(no tool calls)──> finish
      │ tool calls
      v
    act ──(2+ calls safe to run apart)──> fan-out: call_tool × n ──> gathered ─┐
      │ a call that needs a person or an event                                 │
      ├──> wait_for_approval ──> approved / approval_timed_out ────────────────┤
      ├──> wait_for_event ──> event_arrived / event_timed_out ─────────────────┤
      └──(every call answered)──> turn  <───────────────────(act again)────────┘

The conversation is the run's append-only `messages` log (Chat Completions shape): the input as
the first user message, each reply, each tool result; a step appends only the messages it adds,
and the small state holds only this reply's calls (bounded: MAX_CALLS_PER_REPLY calls of at
most MAX_ARGUMENT_CHARS each), so storage grows linearly with the run. A model turn is the
effect `turn` of its step visit and a tool call the effect `tool:<call id>`: a step re-run after
a crash gets both from the ledger instead of calling again.

Which calls fan out. A call whose outcome may be lost (a worker dies mid-send) is safe to send
again only if its receiver honours idempotency keys (webhook, payments) or repeating it does
nothing visible; for the others (email, Slack, an MCP server) the ledger parks the run for a
person ("did it go out?"), and only the main step can park: in a fan-out branch that would fail
the branch, the model would read "failed" and could call again under a new id, acting twice.
So only calls of resend-safe connectors run as branches; every other call (and every sandbox
call: a branch has a workspace of its own) runs one after another in the main step, where an
unknown outcome parks the run and the person's answer settles it before anything else runs.

Limits: `limits.limits_effective` (the definition's, else the tenant's, else
AGENT_DEFAULT_LIMITS); max_turns is pinned in the state at the first turn and fails the run with
a clear reason; tokens, cost and wall time are run_start limits (the ledger's budget check
refuses a turn that would pass them); max_steps is derived from max_turns so it never bites
first. The run's input is also in its state (run_start), so the runner trusts none of its own
state fields at the first visit.
"""

import json
import math
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from agentplatform.storable import json_shape
from integrations.connectors import connector_get
from runs.agents import Agent, RetryPolicy
from runs.engine.ports import EffectError, EffectRefused
from runs.transitions import FanOut, WaitForApproval, WaitForEvent, fail, finish, goto

from .limits import limits_effective
from .spec import Definition, Tool

# The runner's revision. A run pins the runner's step graph and the spec (Agent.topology), not
# this: a change of meaning that keeps the steps is not detected on resume.
RUNNER_VERSION = 2
MESSAGES = "messages"
MAX_CALLS_PER_REPLY = 16  # more in one reply are answered with an error, not run
MAX_ARGUMENT_CHARS = 12_000  # one call's arguments as JSON; longer ones are refused
MAX_REPLY_CHARS = 64_000  # a reply's text kept in the conversation (and the run's result)
MAX_TOOL_RESULT_CHARS = 32_000
# run_start's max_steps: a turn is at most turn + act + gathered + one step per waiting call
STEPS_PER_TURN = MAX_CALLS_PER_REPLY + 3
SANDBOX_ARGS_FILE = ".tool/arguments.json"
WAITS = ("wait_for_event", "wait_for_approval")


def runner_agent(definition: Definition, *, version: int, limits: dict | None = None) -> Agent:
    """The agent that runs one version of a definition, under `limits` (the effective ones,
    limits.limits_effective; default: the definition's over the platform's)."""
    limits = limits_effective(definition.limits) if limits is None else dict(limits)
    definition = replace(definition, limits=limits)  # the spec (and its hash) stay as written
    run_limits = {key: limits[key] for key in ("max_tokens", "max_cost_usd", "max_wall_seconds")
                  if key in limits}
    if "max_turns" in limits:
        run_limits["max_steps"] = limits["max_turns"] * STEPS_PER_TURN + 2
    agent = Agent(definition.name, version=version, logs=[MESSAGES], description=definition.description,
                  input_schema=definition.input_schema, input_example=definition.input_example,
                  limits=run_limits, definition=definition,
                  pins={"definition": definition.spec_hash, "runner": RUNNER_VERSION},
                  # a model turn that fails (a 5xx, a timeout) is tried again, then the run fails
                  retry=RetryPolicy(max_attempts=3, initial_backoff=1.0, max_backoff=10.0))
    everything = list(STEPS)
    for name, fn in STEPS.items():
        agent.step(name=name, start=name == "turn", next=everything)(fn)
    return agent


def _definition(ctx) -> Definition:
    return ctx.agent.definition


# -- the steps -------------------------------------------------------------------------------

def turn(ctx, state):
    """Send the conversation to the model; its reply either ends the run or asks for tools."""
    definition = _definition(ctx)
    first = ctx.visit == 0  # the state holds the run's input then: nothing of ours yet
    turns = 0 if first else int(state.get("turns") or 0)
    max_turns = definition.limits.get("max_turns") if first else state.get("max_turns")
    if max_turns is not None and turns >= max_turns:
        return fail(f"limit reached: max_turns ({max_turns}): the model asked for tools in "
                    f"{turns} turns without giving a final answer")
    asked_at = timezone.now().isoformat()  # before the reply: a bound for its waits' events
    history = list(ctx.log(MESSAGES))
    opening = [] if history else [{"role": "user", "content": _input_message(ctx.input)}]
    messages = [{"role": "system", "content": definition.instructions},
                *(_message_wire(message) for message in history), *opening]
    options = {"tools": [tool.function for tool in definition.tools]} if definition.tools else {}
    if definition.model.temperature is not None:
        options["temperature"] = definition.model.temperature
    reply = ctx.model(messages, model=definition.model.name, name="turn",
                      max_tokens=definition.model.max_tokens, credential=definition.model.credential,
                      **options)
    content = _text(reply.get("content"))
    raw_calls = reply.get("tool_calls") or []
    calls = _calls_read(raw_calls if isinstance(raw_calls, list) else [], turn=turns + 1)
    assistant = {"role": "assistant", "content": content}
    if calls:
        assistant["tool_calls"] = [_call_wire(call) for call in calls]
    append = {MESSAGES: [*opening, assistant]}
    update = {"turns": turns + 1, "max_turns": max_turns, "calls": [], "current": None}
    if not calls:
        return finish({"content": content, "turns": turns + 1}, update=update, append=append)
    return goto("act", update={**update, "calls": [_call_kept(call, asked_at) for call in calls]},
                append=append)


def act(ctx, state):
    """Answer the reply's tool calls: at once where nobody is needed (several resend-safe
    ones: a fan-out), else one at a time, parking for the person or event each one waits for."""
    return _proceed(ctx, state.get("calls", []), [])


def call_tool(ctx, state):
    """A fan-out branch: one call of a resend-safe connector that needs nobody."""
    call = ctx.item
    return finish(_tool_run(ctx, _definition(ctx).tool(call["name"]), call, call["arguments"]))


def gathered(ctx, state):
    """The fan-out's join: each branch's answer becomes a tool result, in call order."""
    results = []
    for branch in ctx.fan_out:
        call = branch.item
        # a branch that failed (its worker kept dying, say) may have reached the receiver
        answer = branch.value if branch.ok else {"error": f"the tool call failed: {branch.error}",
                                                 **_OUTCOME_UNKNOWN}
        results.append(_result_message(call, answer))
    return _proceed(ctx, state.get("calls", []), results)


def approved(ctx, state):
    """A person decided on a tool call: run it (with the arguments as approved, edits and all)
    or tell the model it was refused."""
    call, decision = state["current"], state["approval"]
    tool = _definition(ctx).tool(call["name"])
    if tool.kind == "wait_for_approval":  # the model asked a person: the decision is the answer
        answer = {"approved": decision["approved"], "comment": decision.get("comment", ""),
                  "by": decision.get("by", "")}
        if "artifact" in call["arguments"]:
            answer["artifact"] = decision.get("artifact")
    elif not decision["approved"]:
        answer = {"error": "a person rejected this call; it was not made", "rejected": True,
                  "by": decision.get("by", ""), "comment": decision.get("comment", "")}
    else:
        arguments = decision.get("artifact")
        if arguments is None:
            arguments = call["arguments"]
        problems = tool.argument_errors(arguments)
        if problems:  # an edit that breaks the tool's schema is not run
            answer = {"error": "the approved arguments do not match the tool's parameters, so "
                               "the call was not made: " + "; ".join(problems)}
        else:
            answer = _tool_run(ctx, tool, call, arguments)
    return _proceed(ctx, state.get("calls", []), [_result_message(call, answer)],
                    consumed={"approval": None})


def approval_timed_out(ctx, state):
    """Nobody decided before the wait_for_approval tool's timeout."""
    answer = {"timed_out": True, "approved": False,
              "error": "no person decided before the timeout"}
    return _proceed(ctx, state.get("calls", []), [_result_message(state["current"], answer)],
                    consumed={"timed_out": None})


def event_arrived(ctx, state):
    event = state["event"]
    answer = {"event": event["kind"], "key": event["key"], "payload": event["payload"]}
    return _proceed(ctx, state.get("calls", []), [_result_message(state["current"], answer)],
                    consumed={"event": None})


def event_timed_out(ctx, state):
    call = state["current"]
    answer = {"timed_out": True, "error": "no such event arrived before the timeout"}
    return _proceed(ctx, state.get("calls", []), [_result_message(call, answer)],
                    consumed={"timed_out": None})


STEPS = {"turn": turn, "act": act, "call_tool": call_tool, "gathered": gathered,
         "approved": approved, "approval_timed_out": approval_timed_out,
         "event_arrived": event_arrived, "event_timed_out": event_timed_out}


# -- answering tool calls --------------------------------------------------------------------

def _proceed(ctx, calls: list[dict], results: list[dict], consumed: dict | None = None):
    """Answer what can be answered now; park for the first call that waits; else next turn.
    `consumed`: what a wake-up put in the state, cleared now that it is a tool result."""
    definition = _definition(ctx)
    pending, ready = [], []
    for call in calls:
        tool = definition.tool(call["name"])
        problem = _call_problem(tool, call)
        if problem:
            results.append(_result_message(call, {"error": problem}))
        elif tool.kind in WAITS or tool.approval.needed(call["arguments"]):
            pending.append(call)
        else:
            ready.append(call)
    parallel = [call for call in ready if _resend_safe(definition.tool(call["name"]))]
    if len(parallel) < 2:
        parallel = []
    for call in ready:  # in order, here: an unknown outcome parks the run for a person
        if call not in parallel:
            results.append(_result_message(call, _tool_run(ctx, definition.tool(call["name"]), call,
                                                           call["arguments"])))
    append = {MESSAGES: results} if results else {}
    cleared = dict(consumed or {})
    if parallel:
        return FanOut("call_tool", parallel, "gathered", update={**cleared, "calls": pending},
                      append=append)
    if not pending:
        return goto("turn", update={**cleared, "calls": [], "current": None}, append=append)
    call, rest = pending[0], pending[1:]
    return _wait(ctx, definition.tool(call["name"]), call,
                 {**cleared, "calls": rest, "current": call}, append)


def _resend_safe(tool: Tool) -> bool:
    """Whether a call of this tool may run in a fan-out branch: its connector's receiver
    honours idempotency keys or repeating it acts on nothing (see the module's docstring)."""
    if tool.kind not in ("connector", "mcp"):
        return False
    try:
        receiver = connector_get(tool.options["connector"] if tool.kind == "connector" else "mcp")
    except LookupError:
        return False
    return bool(receiver.honours_idempotency_key or receiver.safe_to_repeat)


def _wait(ctx, tool: Tool, call: dict, update: dict, append: dict):
    arguments = call["arguments"]
    timeout = tool.options.get("timeout_seconds")
    timeout = None if timeout is None else timedelta(seconds=timeout)
    if tool.kind == "wait_for_event":
        key = str(arguments[tool.options["key_argument"]])
        # the wait began with the reply: an event that came while an earlier call of it waited
        # (a person deciding, say) counts, or the run would wait for what already arrived
        since = datetime.fromisoformat(call["asked_at"]) if call.get("asked_at") else None
        return WaitForEvent(tool.options["event"], key, "event_arrived", timeout,
                            "event_timed_out" if timeout else None, since=since,
                            update=update, append=append)
    if tool.kind == "wait_for_approval":
        question = str(arguments.get("question", ""))
        request = {"title": question[:200] or f"{ctx.agent.name} asks", "body": question,
                   "tool": tool.name, "tool_call": call["id"]}
        if "artifact" in arguments:
            request["artifact"] = arguments["artifact"]
        if tool.options.get("deciders"):
            request["deciders"] = tool.options["deciders"]
        return WaitForApproval(request, "approved", timeout,
                               "approval_timed_out" if timeout else None,
                               update=update, append=append)
    # a tool whose approval rule says a person decides: the arguments are the artifact
    why = "every call" if tool.approval.mode == "always" else \
        f"{tool.approval.argument} {tool.approval.operator.replace('_', ' ')} {tool.approval.value!r}"
    request = {"title": f"{ctx.agent.name} wants to call {tool.name}",
               "body": f"{tool.description}\nApproval is required for {why}. Approve to run the "
                       "call with the arguments below (edit them to change what runs), or reject it.",
               "artifact": arguments, "tool": tool.name, "tool_call": call["id"]}
    return WaitForApproval(request, "approved", update=update, append=append)


def _call_problem(tool: Tool | None, call: dict) -> str:
    """Why a call cannot be run as the model wrote it (told to the model, which may try again)."""
    if call.get("refused"):
        return call["refused"]
    if tool is None:
        return f"there is no tool named {call['name']!r}"
    if call.get("unreadable"):
        return f"the arguments are not a JSON object: {call['unreadable']}"
    problems = tool.argument_errors(call["arguments"])
    if problems:
        return "the arguments do not match the tool's parameters: " + "; ".join(problems)
    if tool.kind == "wait_for_event":
        key = call["arguments"].get(tool.options["key_argument"])
        if not isinstance(key, (str, int)) or isinstance(key, bool) or not str(key) or len(str(key)) > 255:
            return (f"argument {tool.options['key_argument']!r} must be the event's key: a string "
                    "of 1 to 255 characters")
    return ""


def _tool_run(ctx, tool: Tool, call: dict, arguments: dict) -> Any:
    """Run a call that needs nobody (any more): an effect, an MCP call or a sandbox command.
    A receiver's refusal (a declined card, a 4xx), or a failure that outlived the step's
    retries, is the call's answer: the model reads it, the run goes on. (A step re-run replays
    the same answer: the ledger keeps the failure.)"""
    try:
        return _tool_call(ctx, tool, call, arguments)
    except EffectRefused as exc:
        return {"error": f"the call was refused: {exc}"}
    except EffectError as exc:
        if ctx.attempt < ctx.agent.retry.max_attempts:
            raise  # the step's retry policy tries again (recorded calls are not redone)
        # "Failed" would invite the model to call again, under a new key: a person says instead.
        if exc.maybe_sent and ctx.branch is None:
            ctx.effect_outcome_unknown(f"tool:{call['id']}")
        answer = {"error": f"the call failed, {ctx.attempt} attempts: {exc}"}
        if exc.maybe_sent:  # a branch cannot park: the model is told, at least
            answer.update(_OUTCOME_UNKNOWN)
        return answer


_OUTCOME_UNKNOWN = {"outcome_unknown": True, "warning": (
    "the receiver may have acted on this call: it failed after it was sent. Calling the tool "
    "again is a new call, which the receiver will not recognise as a repeat; check with a "
    "person or the receiver before you do.")}


def _tool_call(ctx, tool: Tool, call: dict, arguments: dict) -> Any:
    name = f"tool:{call['id']}"
    if tool.kind == "connector":
        return ctx.effect(name, tool.options["connector"], credential=tool.options["credential"],
                          **arguments)
    if tool.kind == "mcp":
        return ctx.effect(name, "mcp", credential=tool.options["server"],
                          tool=tool.options["remote_name"], arguments=arguments)
    if tool.kind == "sandbox":
        return _sandbox_run(ctx, tool, name, arguments)
    raise ValueError(f"a {tool.kind} tool is not run, it waits")


def _sandbox_run(ctx, tool: Tool, name: str, arguments: dict) -> dict:
    language = tool.options["language"]
    script = tool.options.get("command") or arguments["script"]
    command = ["bash", "-c", script] if language == "bash" else ["python3", "-c", script]
    fixed = "command" in tool.options  # the model's arguments reach a fixed script as a file
    result = ctx.sandbox.run(command, name=name,
                             files={SANDBOX_ARGS_FILE: json.dumps(arguments)} if fixed else None)
    return {"exit_code": result.exit_code, "stdout": result.stdout, "stderr": result.stderr,
            **({"limit": result.limit} if result.limit else {})}


# -- the wire shape of calls and results -----------------------------------------------------

def _input_message(input: dict) -> str:
    return json.dumps(input, ensure_ascii=False, sort_keys=True)


def _text(content: Any) -> str | None:
    """A reply's text as the conversation keeps it: a string, cut at MAX_REPLY_CHARS."""
    if content is None:
        return None
    if not isinstance(content, str):
        content = json.dumps(content, ensure_ascii=False, default=str)
    if len(content) > MAX_REPLY_CHARS:
        content = content[:MAX_REPLY_CHARS] + f"... [cut: {len(content)} characters in all]"
    return content


def _calls_read(raw_calls: list, *, turn: int) -> list[dict]:
    """The reply's tool calls, each with an id unique in the reply (a model may send none, or
    the same one twice): the id names the call's effect in its step visit. Calls past
    MAX_CALLS_PER_REPLY, or with arguments over MAX_ARGUMENT_CHARS, are kept (every call gets a
    result) but refused."""
    calls, seen = [], set()
    for index, raw in enumerate(raw_calls[:MAX_CALLS_PER_REPLY * 4]):
        call = _call_read(raw if isinstance(raw, dict) else {})
        if not call["id"] or call["id"] in seen or len(call["id"]) > 80:
            # a fallback may be an id the model gave another call of this reply: two calls
            # under one id would be one effect (the second replays the first's result)
            fallback, suffix = f"call_{turn}_{index}", 0
            taken = seen | {str(r.get("id") or "") for r in raw_calls if isinstance(r, dict)}
            while fallback in taken:
                suffix += 1
                fallback = f"call_{turn}_{index}_{suffix}"
            call["id"] = fallback
        seen.add(call["id"])
        if index >= MAX_CALLS_PER_REPLY:
            call.update(arguments={}, refused=f"more than {MAX_CALLS_PER_REPLY} tool calls in one "
                        "reply: this one was not made; call it again in a later turn")
        calls.append(call)
    return calls


def _call_read(raw: dict) -> dict:
    """A Chat Completions tool call as the runner keeps it: id, name, parsed arguments."""
    function = raw.get("function") if isinstance(raw.get("function"), dict) else {}
    text = function.get("arguments") or "{}"
    text = text if isinstance(text, str) else json.dumps(text, default=str)
    call = {"id": str(raw.get("id") or ""), "name": str(function.get("name") or "")[:200],
            "arguments": {}, "raw_arguments": text}
    if len(text) > MAX_ARGUMENT_CHARS:
        call.update(raw_arguments="{}", refused=f"the arguments are {len(text)} characters, over "
                    f"the {MAX_ARGUMENT_CHARS} a call may have: this call was not made")
        return call
    try:
        arguments = json.loads(text, parse_constant=_not_finite, parse_float=_finite)
    except ValueError as exc:
        call["unreadable"] = str(exc)
        return call
    except RecursionError:  # "[[[[..." within the size limit: the model's text, not our bug
        call.update(raw_arguments="{}", unreadable="the arguments are nested too deeply")
        return call
    if not isinstance(arguments, dict):
        call["unreadable"] = f"got {type(arguments).__name__}"
        return call
    _, unstorable = json_shape(arguments)  # what the run's state (jsonb) cannot hold
    if unstorable:
        call["unreadable"] = unstorable
    else:
        call["arguments"] = _as_stored(arguments)
    return call


def _as_stored(value: Any) -> Any:
    """`value` as it comes back from jsonb: a float Python writes with an exponent (1e+16)
    comes back an integer. The step right after the turn reads the calls from memory, a re-run
    after a crash from the checkpoint: their effects' digests must be the same."""
    if isinstance(value, float) and "e+" in repr(value):
        return int(value)
    if isinstance(value, dict):
        return {key: _as_stored(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_as_stored(item) for item in value]
    return value


def _call_kept(call: dict, asked_at: str) -> dict:
    """A call as the small state holds it until answered (its wire text is in the log), with
    when the model asked for it: a wait that comes after another one of the reply began then."""
    return {**{key: value for key, value in call.items() if key != "raw_arguments"},
            "asked_at": asked_at}


def _not_finite(text: str):
    raise ValueError(f"{text} is not a finite number (jsonb, and JSON itself, have none)")


def _finite(text: str) -> float:
    """A number the run's state can hold: 1e999 parses to inf, which jsonb refuses."""
    number = float(text)
    if not math.isfinite(number):
        _not_finite(text)
    return number


def _message_wire(message: dict) -> dict:
    """A logged message as the provider takes it: a tool result's `name` is the log's (for
    people reading the conversation), not part of Chat Completions' tool message."""
    if message.get("role") == "tool":
        return {key: value for key, value in message.items() if key != "name"}
    return message


def _call_wire(call: dict) -> dict:
    return {"id": call["id"], "type": "function",
            "function": {"name": call["name"], "arguments": call["raw_arguments"]}}


def _result_message(call: dict, answer: Any) -> dict:
    content = json.dumps(answer, ensure_ascii=False, sort_keys=True, default=str)
    if len(content) > MAX_TOOL_RESULT_CHARS:
        content = content[:MAX_TOOL_RESULT_CHARS] + f"... [cut: {len(content)} characters in all]"
    return {"role": "tool", "tool_call_id": call["id"], "name": call["name"], "content": content}
