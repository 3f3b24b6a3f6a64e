"""`rollout` v2 and v3: loaded by the test process and by the workers a test starts with it in
AGENT_MODULES, never by the session's workers (they play the old deploy)."""

from runs.agents import Agent
from runs.engine import worker_id
from runs.transitions import finish

rollout_v2 = Agent("rollout", version=2)


@rollout_v2.step(start=True, next=[], name="work")
def work_v2(ctx, state):
    return finish({"version": 2, "worker": worker_id()})


rollout_v3 = Agent("rollout", version=3)  # renamed its step: runs at "work" cannot move here


@rollout_v3.step(start=True, next=[])
def labour(ctx, state):
    return finish({"version": 3})
