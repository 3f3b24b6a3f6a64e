"""Agents for the sandbox tests: each step runs a list of commands in the run's jail."""

import os
import time
from pathlib import Path

from runs.agents import Agent, RetryPolicy
from runs.transitions import fail, fan_out, finish, goto

# input: {"steps": [[command, ...], ...]}; a command is a shell string or
# {"command": ..., "files": {...}, "timeout": s, "name": ..., "block_while": host path}
# ("block_while": while that host file exists the command ends with a long sleep, so a test
# can kill the worker mid-command).
sandboxed = Agent("sandboxed", version=1, logs=["results"],
                  retry=RetryPolicy(max_attempts=3, initial_backoff=0.01))


def summary(result) -> dict:
    return {"exit_code": result.exit_code, "limit": result.limit, "stdout": result.stdout[-4000:],
            "stderr": result.stderr[-1000:], "changed": result.changed_files,
            "replayed": result.replayed}


@sandboxed.step(start=True, next=["work", "done"])
def work(ctx, state):
    i = state.get("i", 0)
    results = []
    for spec in state["steps"][i]:
        spec = {"command": spec} if isinstance(spec, str) else dict(spec)
        command = spec["command"]
        if spec.get("block_while") and os.path.exists(spec["block_while"]):
            command += "; sleep 300"
        result = ctx.sandbox.run(command, files=spec.get("files"), timeout=spec.get("timeout"),
                                 name=spec.get("name"))
        results.append(summary(result))
    if state.get("break_after_sandbox_at") == i and ctx.attempt == 1:
        raise RuntimeError("the step broke after its sandbox work")
    nxt = "done" if i + 1 >= len(state["steps"]) else "work"
    return goto(nxt, update={"i": i + 1}, append={"results": [results]})


@sandboxed.step(next=[])
def done(ctx, state):
    return finish({"results": list(state.log("results"))})


# input: {"items": [name, ...], "barrier": host dir}. Before the fan-out the run's workspace
# holds base.txt; each branch writes <item>.txt, waits on the host until every branch has
# written its own (so they run side by side), then lists and reads its workspace.
sandbox_branches = Agent("sandbox_branches", version=1)


@sandbox_branches.step(start=True, next=["branch_work", "joined"])
def scatter(ctx, state):
    ctx.sandbox.run("echo base > base.txt")
    return fan_out("branch_work", state["items"], then="joined")


@sandbox_branches.step(next=[])
def branch_work(ctx, state):
    ctx.sandbox.run(f"echo {ctx.item} > {ctx.item}.txt")
    barrier = Path(state["barrier"])
    (barrier / ctx.item).touch()
    deadline = time.monotonic() + 60
    while len(list(barrier.iterdir())) < len(state["items"]):
        if time.monotonic() > deadline:
            return fail("the other branches never ran alongside this one")
        time.sleep(0.05)
    listing = ctx.sandbox.run("ls", name="ls").stdout.split()
    return finish({"ls": listing, "mine": ctx.sandbox.read(f"{ctx.item}.txt").decode().strip()})


@sandbox_branches.step(next=[])
def joined(ctx, state):
    branches = [r.value if r.ok else f"failed: {r.error}" for r in ctx.fan_out]
    return finish({"branches": branches, "join": ctx.sandbox.run("ls", name="ls").stdout.split()})
