"""The runner: the one operator agent that interprets a tenant's definition, so a tenant's agent
is data and never Python in a worker. Every version of every definition becomes an `Agent` with
these steps (`runner_agent`); the definition's hash is part of its topology.

    turn ──(no tool calls)──> finish
      │ tool calls
      v
    act ──(2+ calls that need nobody)──> fan-out: call_tool × n ──> gathered ─┐
      │ a call that needs a person or an event                               │
      ├──> wait_for_approval ──> approved ───────────────────────────────────┤
      ├──> wait_for_event ──> event_arrived / event_timed_out ───────────────┤
      └──(every call answered)──> turn  <─────────────────(act again)────────┘

The conversation is the run's append-only `messages` log (Chat Completions shape): the input as
the first user message, each reply, each tool result. A model turn is the effect `turn` of its
step visit and a tool call the effect `tool:<call id>`: a step re-run after a crash gets both
from the ledger instead of calling again. Sandbox tools run in the run's jail (`ctx.sandbox`).
"""

import json
from datetime import timedelta
from typing import Any

from runs.agents import Agent, RetryPolicy
from runs.transitions import FanOut, fail, finish, goto, wait_for_approval, wait_for_event

from .spec import Definition, Tool

RUNNER_VERSION = 1  # part of every tenant agent's topology: a new runner is new code
MESSAGES = "messages"
STEPS_PER_TURN = 6  # run_start's max_steps: turns × this, so max_turns is the limit that bites
MAX_TOOL_RESULT_CHARS = 32_000
SANDBOX_ARGS_FILE = ".tool/arguments.json"


def runner_agent(definition: Definition, *, version: int) -> Agent:
    """The agent that runs one version of a definition."""
    limits = {key: definition.limits[key] for key in ("max_tokens", "max_cost_usd", "max_wall_seconds")
              if key in definition.limits}
    if "max_turns" in definition.limits:
        limits["max_steps"] = definition.limits["max_turns"] * STEPS_PER_TURN + 2
    agent = Agent(definition.name, version=version, logs=[MESSAGES], description=definition.description,
                  input_schema=definition.input_schema, input_example=definition.input_example,
                  limits=limits, definition=definition,
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
    turns = state.get("turns", 0)
    max_turns = definition.limits.get("max_turns")
    if max_turns is not None and turns >= max_turns:
        return fail(f"limit reached: max_turns ({max_turns}) turns without a final answer")
    history = list(ctx.log(MESSAGES))
    opening = [] if history else [{"role": "user", "content": _input_message(ctx.input)}]
    messages = [{"role": "system", "content": definition.instructions}, *history, *opening]
    options = {"tools": [tool.function for tool in definition.tools]} if definition.tools else {}
    if definition.model.temperature is not None:
        options["temperature"] = definition.model.temperature
    reply = ctx.model(messages, model=definition.model.name, name="turn",
                      max_tokens=definition.model.max_tokens, credential=definition.model.credential,
                      **options)
    calls = _calls_read(reply.get("tool_calls") or [], turn=turns + 1)
    assistant = {"role": "assistant", "content": reply.get("content")}
    if calls:
        assistant["tool_calls"] = [_call_wire(call) for call in calls]
    append = {MESSAGES: [*opening, assistant]}
    update = {"turns": turns + 1}
    if not calls:
        return finish({"content": reply.get("content"), "turns": turns + 1},
                      update=update, append=append)
    return goto("act", update={**update, "calls": calls}, append=append)


def act(ctx, state):
    """Answer the reply's tool calls: at once where nobody is needed (several: a fan-out),
    else one at a time, parking for the person or event each one waits for."""
    return _proceed(ctx, state.get("calls", []), [])


def call_tool(ctx, state):
    """A fan-out branch: one tool call that needs nobody."""
    call = ctx.item
    return finish(_tool_run(ctx, _definition(ctx).tool(call["name"]), call, call["arguments"]))


def gathered(ctx, state):
    """The fan-out's join: each branch's answer becomes a tool result, in call order."""
    results = []
    for branch in ctx.fan_out:
        call = branch.item
        answer = branch.value if branch.ok else {"error": f"the tool call failed: {branch.error}"}
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
        return _proceed(ctx, state.get("calls", []), [_result_message(call, answer)])
    if not decision["approved"]:
        answer = {"error": "a person refused this call", "by": decision.get("by", ""),
                  "comment": decision.get("comment", "")}
        return _proceed(ctx, state.get("calls", []), [_result_message(call, answer)])
    arguments = decision.get("artifact")
    if arguments is None:
        arguments = call["arguments"]
    problems = tool.argument_errors(arguments)
    if problems:  # an edit that breaks the tool's schema is not run
        answer = {"error": "the approved arguments do not match the tool's parameters: "
                           + "; ".join(problems)}
    else:
        answer = _tool_run(ctx, tool, call, arguments)
    return _proceed(ctx, state.get("calls", []), [_result_message(call, answer)])


def event_arrived(ctx, state):
    event = state["event"]
    answer = {"event": event["kind"], "key": event["key"], "payload": event["payload"]}
    return _proceed(ctx, state.get("calls", []), [_result_message(state["current"], answer)])


def event_timed_out(ctx, state):
    answer = {"timed_out": True, "error": "no such event arrived before the timeout"}
    return _proceed(ctx, state.get("calls", []), [_result_message(state["current"], answer)])


STEPS = {"turn": turn, "act": act, "call_tool": call_tool, "gathered": gathered,
         "approved": approved, "event_arrived": event_arrived, "event_timed_out": event_timed_out}


# -- answering tool calls --------------------------------------------------------------------

def _proceed(ctx, calls: list[dict], results: list[dict]):
    """Answer what can be answered now; park for the first call that waits; else next turn."""
    definition = _definition(ctx)
    pending, ready = [], []
    for call in calls:
        tool = definition.tool(call["name"])
        problem = _call_problem(tool, call)
        if problem:
            results.append(_result_message(call, {"error": problem}))
        elif tool.kind in ("wait_for_event", "wait_for_approval") or tool.approval.needed(call["arguments"]):
            pending.append(call)
        else:
            ready.append(call)
    # Sandbox calls run here, in order: a fan-out branch would have a workspace of its own.
    parallel = [call for call in ready if definition.tool(call["name"]).kind != "sandbox"]
    if len(parallel) > 1:
        for call in ready:
            if call not in parallel:
                results.append(_result_message(call, _tool_run(ctx, definition.tool(call["name"]), call,
                                                               call["arguments"])))
        return FanOut("call_tool", parallel, "gathered", update={"calls": pending},
                      append={MESSAGES: results} if results else {})
    for call in ready:
        results.append(_result_message(call, _tool_run(ctx, definition.tool(call["name"]), call,
                                                       call["arguments"])))
    append = {MESSAGES: results} if results else {}
    if not pending:
        return goto("turn", update={"calls": [], "current": None}, append=append)
    call, rest = pending[0], pending[1:]
    update = {"calls": rest, "current": call}
    return _wait(ctx, definition.tool(call["name"]), call, update, append)


def _wait(ctx, tool: Tool, call: dict, update: dict, append: dict):
    arguments = call["arguments"]
    timeout = tool.options.get("timeout_seconds")
    timeout = None if timeout is None else timedelta(seconds=timeout)
    if tool.kind == "wait_for_event":
        key = arguments[tool.options["key_argument"]]
        return wait_for_event(tool.options["event"], str(key), then="event_arrived", timeout=timeout,
                              on_timeout="event_timed_out" if timeout else None,
                              update=update, append=append)
    if tool.kind == "wait_for_approval":
        request = {"title": str(arguments.get("question", ""))[:200] or f"{ctx.agent.name} asks",
                   "body": str(arguments.get("question", "")), "tool": tool.name}
        if "artifact" in arguments:
            request["artifact"] = arguments["artifact"]
        if tool.options.get("deciders"):
            request["deciders"] = tool.options["deciders"]
    else:  # a tool whose approval rule says a person decides: the arguments are the artifact
        why = "every call" if tool.approval.mode == "always" else \
            f"{tool.approval.argument} {tool.approval.operator.replace('_', ' ')} {tool.approval.value!r}"
        request = {"title": f"{ctx.agent.name} wants to call {tool.name}",
                   "body": f"{tool.description}\nApproval is required for {why}. Approve to run the "
                           "call with the arguments below (edit them to change what runs), or reject it.",
                   "artifact": arguments, "tool": tool.name}
    return wait_for_approval(request, then="approved", timeout=timeout,
                             on_timeout="event_timed_out" if timeout else None,
                             update=update, append=append)


def _call_problem(tool: Tool | None, call: dict) -> str:
    """Why a call cannot be run as the model wrote it (told to the model, which may try again)."""
    if tool is None:
        return f"there is no tool named {call['name']!r}"
    if call.get("unreadable"):
        return f"the arguments are not a JSON object: {call['unreadable']}"
    problems = tool.argument_errors(call["arguments"])
    return "the arguments do not match the tool's parameters: " + "; ".join(problems) if problems else ""


def _tool_run(ctx, tool: Tool, call: dict, arguments: dict) -> Any:
    """Run a call that needs nobody (any more): an effect, an MCP call or a sandbox command."""
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


def _calls_read(raw_calls: list, *, turn: int) -> list[dict]:
    """The reply's tool calls, each with an id unique in the run (a model may send none, or
    the same one twice): the id names the call's effect."""
    calls, seen = [], set()
    for index, raw in enumerate(raw_calls):
        call = _call_read(raw if isinstance(raw, dict) else {})
        if not call["id"] or call["id"] in seen or len(call["id"]) > 80:
            call["id"] = f"call_{turn}_{index}"
        seen.add(call["id"])
        calls.append(call)
    return calls


def _call_read(raw: dict) -> dict:
    """A Chat Completions tool call as the runner keeps it: id, name, parsed arguments."""
    function = raw.get("function") or {}
    text = function.get("arguments") or "{}"
    call = {"id": str(raw.get("id") or ""), "name": str(function.get("name") or ""), "arguments": {},
            "raw_arguments": text if isinstance(text, str) else json.dumps(text)}
    try:
        arguments = json.loads(text) if isinstance(text, str) else text
    except ValueError as exc:
        call["unreadable"] = str(exc)
        return call
    if not isinstance(arguments, dict):
        call["unreadable"] = f"got {type(arguments).__name__}"
    else:
        call["arguments"] = arguments
    return call


def _call_wire(call: dict) -> dict:
    return {"id": call["id"], "type": "function",
            "function": {"name": call["name"], "arguments": call["raw_arguments"]}}


def _result_message(call: dict, answer: Any) -> dict:
    content = json.dumps(answer, ensure_ascii=False, sort_keys=True, default=str)
    if len(content) > MAX_TOOL_RESULT_CHARS:
        content = content[:MAX_TOOL_RESULT_CHARS] + f"... [cut: {len(content)} characters in all]"
    return {"role": "tool", "tool_call_id": call["id"], "name": call["name"], "content": content}
