"""A research loop: each iteration appends one finding to the append-only `findings` log and
stops after `iterations` rounds or when the (simulated) budget is spent.

Input: {"topic": str, "iterations": int = 5, "budget": int = 100, "cost_per_iteration": int = 10}
"""

import hashlib

from runs.agents import Agent
from runs.transitions import finish, goto

INPUT_SCHEMA = {
    "type": "object",
    "properties": {
        "topic": {"type": "string", "minLength": 1},
        "iterations": {"type": "integer", "minimum": 1},
        "budget": {"type": "integer", "minimum": 0},
        "cost_per_iteration": {"type": "integer", "minimum": 0},
    },
}

research = Agent("research", version=1, logs=["findings"],
                 description="Appends a finding per iteration; stops after N or a budget.",
                 input_schema=INPUT_SCHEMA,
                 input_example={"topic": "durable agents", "iterations": 3, "budget": 100})


@research.step(start=True, next=["investigate"])
def plan(ctx, state):
    return goto("investigate", update={"iteration": 0, "spent": 0,
                                       "topic": state.get("topic", "durable agents")})


@research.step(next=["investigate", "summarize"])
def investigate(ctx, state):
    iteration = state["iteration"] + 1
    spent = state["spent"] + state.get("cost_per_iteration", 10)
    # Deterministic stand-in for a model/tool call (issue 5 routes real ones through ctx.model).
    digest = hashlib.sha256(f"{state['topic']}:{iteration}".encode()).hexdigest()[:12]
    finding = {"iteration": iteration, "note": f"{state['topic']}: lead {digest}"}
    done = iteration >= state.get("iterations", 5) or spent >= state.get("budget", 100)
    return goto("summarize" if done else "investigate",
                update={"iteration": iteration, "spent": spent}, append={"findings": [finding]})


@research.step(next=[])
def summarize(ctx, state):
    findings = state.log("findings")
    return finish({"topic": state["topic"], "findings": len(findings),
                   "last": findings[-1]["note"] if len(findings) else None,
                   "spent": state["spent"]})
