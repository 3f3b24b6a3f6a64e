"""Agents for the engine's edges (tests/runs/test_engine_edges.py, test_poison.py,
test_rolling_deploy.py): poison steps, swallowed interrupts, fenced branches, rolling deploys.

Workers load this module (AGENT_MODULES); `rollout` v2 lives in tests/rollout_v2_agents.py,
which only some workers load."""

import os

from django.db import OperationalError, connection

from runs.agents import Agent, RetryPolicy
from runs.engine import branch_claim
from runs.models import Branch
from runs.transitions import fan_out, finish, goto

# A step that kills its worker every time it runs (like an OOM kill or a segfault).
poison = Agent("poison", version=1)


@poison.step(start=True, next=[])
def crash(ctx, state):
    os._exit(1)


# A step that catches everything, interrupts included, and carries on as if nothing happened.
swallower = Agent("swallower", version=1, retry=RetryPolicy(max_attempts=3, initial_backoff=0))


@swallower.step(start=True, next=["after"])
def gulp(ctx, state):
    try:
        if state["how"] == "budget":
            ctx.model([{"role": "user", "content": "hi"}], max_tokens=100)
        else:  # its outcome is unknown: a person must say
            ctx.effect("ask", "test_keyed", url=state["url"])
    except Exception:  # noqa: BLE001  (the point: a step that swallows everything)
        pass
    return goto("after")


@swallower.step(next=[])
def after(ctx, state):
    return finish({"swallowed": True})


# A step whose database goes away: the worker must stop, not burn the step's retries.
db_away = Agent("db_away", version=1, retry=RetryPolicy(max_attempts=3, initial_backoff=0))


@db_away.step(start=True, next=[])
def query(ctx, state):
    raise OperationalError("server closed the connection unexpectedly")


# A fan-out whose branch loses its lease to another worker just before it acts.
overtaken = Agent("overtaken", version=1)


@overtaken.step(start=True, next=["act", "join"])
def spread_out(ctx, state):
    return fan_out("act", [state["url"]], then="join")


@overtaken.step(next=[])
def act(ctx, state):
    if state.get("take_over"):  # as if this worker froze and the watchdog handed it on
        with connection.cursor() as cursor:
            cursor.execute(f"UPDATE {Branch._meta.db_table} SET lease_expires_at = now() "
                           "- interval '1 second' WHERE run_id = %s AND index = %s",
                           [ctx.run_id, ctx.branch])
        assert branch_claim(run_id=ctx.run_id, index=ctx.branch, owner="successor")
    return finish(ctx.effect("post", "test_keyed", url=ctx.item))


@overtaken.step(next=[])
def join(ctx, state):
    return finish([r.value for r in ctx.fan_out])


# Rolling deploys: v1 everywhere; v2 (tests/rollout_v2_agents.py) on some workers only.
rollout = Agent("rollout", version=1)


@rollout.step(start=True, next=[])
def work(ctx, state):
    if state.get("v1_breaks"):
        raise RuntimeError("v1 of this step is broken")
    return finish({"version": 1})
