"""Sandbox calls are scoped like effects: each fan-out branch records (and replays) its own
calls, so parallel branches that run different commands neither collide nor swap results."""

from runs import engine
from runs.agents import Agent
from runs.models import Run
from runs.services import run_start
from runs.transitions import fan_out, finish
from sandboxes.models import SandboxExecution

sandbox_fan = Agent("sandbox_fan", version=1)


@sandbox_fan.step(start=True, next=["echo", "collect"])
def scatter(ctx, state):
    return fan_out("echo", state["words"], then="collect")


@sandbox_fan.step(next=[])
def echo(ctx, state):
    return finish(ctx.sandbox.run(f"echo {ctx.item}").stdout.strip())


@sandbox_fan.step(next=[])
def collect(ctx, state):
    results = ctx.fan_out
    return finish([r.value if r.ok else f"failed: {r.error}" for r in results])


def test_fan_out_branches_keep_their_own_sandbox_calls(in_acme, s3):
    run = run_start(agent="sandbox_fan", input={"words": ["north", "south", "east"]},
                    enqueue=False).run
    assert engine.advance(run_id=run.id) == engine.Outcome.PARKED
    for index in range(3):
        assert engine.branch_advance(run_id=run.id, index=index) == engine.Outcome.ENDED
    assert engine.advance(run_id=run.id, slice_seconds=600) == engine.Outcome.ENDED
    run = Run.objects.get(id=run.id)
    assert run.status == "succeeded" and run.result == ["north", "south", "east"]
    assert sorted(SandboxExecution.objects.filter(run=run).values_list("scope", "name")) == [
        ("1/b0", "sandbox-1"), ("1/b1", "sandbox-1"), ("1/b2", "sandbox-1")]

