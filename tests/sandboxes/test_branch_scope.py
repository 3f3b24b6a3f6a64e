"""Sandbox calls are scoped like effects: each fan-out branch records (and replays) its own
calls, so parallel branches that run different commands neither collide nor swap results;
and each branch works in a workspace of its own, started from the run's as of the fan-out."""

import re
import shutil
import uuid
from pathlib import Path

from django.conf import settings

from runs import engine
from runs.agents import Agent
from runs.dispatch.models import ReadyRun
from runs.models import Run
from runs.services import run_start
from runs.transitions import fan_out, finish
from sandboxes.models import SandboxExecution, WorkspaceSnapshot
from sandboxes.services import SandboxSession, run_dir
from tests.support.runs import advanced, dispatcher_held
from tests.support.waiting import wait_for

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
    with dispatcher_held():  # driven here, the join too, not by a session worker
        assert advanced(run.id) == engine.Outcome.PARKED
        ReadyRun.objects.filter(run_id=run.id).delete()
        for index in range(3):
            assert engine.branch_advance(run_id=run.id, index=index) == engine.Outcome.ENDED
        assert engine.advance(run_id=run.id, slice_seconds=600) == engine.Outcome.ENDED
    run = Run.objects.get(id=run.id)
    assert run.status == "succeeded" and run.result == ["north", "south", "east"]
    assert sorted(SandboxExecution.objects.filter(run=run).values_list("scope", "name")) == [
        ("1/b0", "sandbox-1"), ("1/b1", "sandbox-1"), ("1/b2", "sandbox-1")]



def test_parallel_branches_work_in_workspaces_of_their_own_and_leave_the_runs_alone(
        in_acme, worker, start_worker):
    start_worker("branches", concurrency=2)  # free slots for both branches at once, however
    # busy the session's worker is: each branch waits until the other has written
    barrier = Path(settings.SANDBOX_WORKSPACE_ROOT) / f"barrier-{uuid.uuid4().hex}"
    barrier.mkdir(parents=True)
    run = run_start(agent="sandbox_branches",
                    input={"items": ["left", "right"], "barrier": str(barrier)}).run

    def ended():
        found = Run.objects.get(id=run.id)
        return found if found.status in ("succeeded", "failed") else None

    run = wait_for(ended, timeout=120, interval=0.1, what="the fan-out run to end")
    assert run.status == "succeeded", run.error
    # Both branches ran at once on the worker's two processes; each saw only its own file.
    assert run.result["branches"] == [
        {"ls": ["base.txt", "left.txt"], "mine": "left"},
        {"ls": ["base.txt", "right.txt"], "mine": "right"},
    ]
    assert run.result["join"] == ["base.txt"]  # the run's workspace as of the fan-out
    snapshots = WorkspaceSnapshot.objects.filter(run=run).order_by("visit", "scope")
    names = [re.sub(r"\.[0-9a-f]{12}\.tar", ".tar", s.object_key.rsplit("/", 1)[1])
             for s in snapshots]  # each write has a key of its own: <name>.<random>.tar.gz.enc
    assert [(s.visit, s.scope, name) for s, name in zip(snapshots, names, strict=True)] == [
        (0, "", "0.tar.gz.enc"), (1, "1/b0", "1-b0.tar.gz.enc"), (1, "1/b1", "1-b1.tar.gz.enc")]

    # A branch run again elsewhere (its worker died before it reported) gets its own
    # workspace back from its own snapshot, and replays its calls.
    shutil.rmtree(run_dir(schema="acme", run_id=run.id, scope="1/b1"))
    again = SandboxSession(run_id=run.id, visit=1, scope="1/b1")
    assert again.run("ls", name="ls").replayed
    assert again.read("right.txt") == b"right\n"
    assert not (again.local.path / "left.txt").exists()
