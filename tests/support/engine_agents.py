"""Agents for the engine's edges (tests/runs/test_engine_edges.py, test_poison.py,
test_rolling_deploy.py): poison steps, swallowed interrupts, fenced branches, rolling deploys.

Workers load this module (AGENT_MODULES); `rollout` v2 lives in tests/rollout_v2_agents.py,
which only some workers load."""

import os
from datetime import UTC, datetime, timedelta

from django.db import OperationalError, connection

from runs.agents import Agent, RetryPolicy
from runs.engine import branch_claim
from runs.models import Branch
from runs.transitions import (
    Sleep,
    fail,
    fan_out,
    finish,
    goto,
    run_child,
    sleep,
    wait_for_approval,
    wait_for_event,
)

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


# A step that returns what PostgreSQL cannot store (jsonb and text refuse NaN, U+0000 and lone
# surrogates): the step fails in words, never a DataError at the write that retries forever.
UNSTORABLE = {
    "nan_state": lambda ctx: goto("after_bad", update={"x": float("nan")}),
    "nul_state": lambda ctx: goto("after_bad", update={"x": "a\x00b"}),
    "nul_key": lambda ctx: goto("after_bad", update={"a\x00": 1}),
    "surrogate_log": lambda ctx: goto("after_bad", append={"notes": ["\ud800"]}),
    "nul_in_tuple": lambda ctx: goto("after_bad", append={"notes": [("a\x00",)]}),
    "deep_state": lambda ctx: goto("after_bad", update={"x": _nested(100_000)}),
    "object_log": lambda ctx: goto("after_bad", append={"notes": [object()]}),
    "inf_result": lambda ctx: finish(float("inf")),
    "nan_notify": lambda ctx: (ctx.notify("n", "test_keyed", x=float("nan")), goto("after_bad"))[1],
    "nul_by_str": lambda ctx: (ctx.notify("n", "test_keyed", error=ValueError("a\x00")),
                               goto("after_bad"))[1],
    "long_notify_name": lambda ctx: (ctx.notify("n" * 201, "test_keyed"), goto("after_bad"))[1],
    "long_event_key": lambda ctx: wait_for_event("reply", "k" * 256, then="after_bad"),
    "deep_result": lambda ctx: finish(_nested(900)),
    "nan_effect": lambda ctx: goto("after_bad", update={"x": ctx.effect(
        "e", "test_keyed", url="http://127.0.0.1:9/never", x=float("nan"))}),
    "nul_reason": lambda ctx: fail("bad\x00reason"),  # text: kept, U+0000 made U+FFFD
    "nan_branch": lambda ctx: fan_out("bad_branch", [1], then="join_bad"),
    # misshapen: a field of the wrong type (a step may build them from a model's output)
    "fail_number": lambda ctx: fail(42),
    "approval_list": lambda ctx: wait_for_approval(["ship it?"], then="after_bad"),
    "deciders_text": lambda ctx: wait_for_approval({"deciders": "ann"}, then="after_bad"),
    "huge_timeout": lambda ctx: wait_for_event("reply", "k", then="after_bad",
                                               timeout=timedelta(days=10**6)),
    "timeout_number": lambda ctx: wait_for_approval({}, then="after_bad", timeout=60),
    "naive_sleep": lambda ctx: sleep(then="after_bad", until=datetime(2030, 1, 1)),
    "far_sleep": lambda ctx: sleep(then="after_bad", until=datetime(9999, 1, 1, tzinfo=UTC)),
    "child_list": lambda ctx: run_child("chatter", ["x"], then="after_bad"),
    "ancient_sleep": lambda ctx: sleep(then="after_bad", until=datetime(1, 1, 2, tzinfo=UTC)),
    "ancient_since": lambda ctx: wait_for_event("reply", "k", then="after_bad",
                                                since=datetime(1, 1, 2, tzinfo=UTC)),
    "negative_timeout": lambda ctx: wait_for_approval({}, then="after_bad",
                                                      timeout=timedelta(days=-10**6)),
    "bare_sleep": lambda ctx: Sleep("after_bad"),
    "goto_list": lambda ctx: goto(["after_bad"]),
    "deciders_dicts": lambda ctx: wait_for_approval({"deciders": [{"a": 1}]}, then="after_bad"),
    "wide_fan_out": lambda ctx: fan_out("bad_branch", list(range(10_001)), then="join_bad"),
    "fail_number_branch": lambda ctx: fan_out("bad_branch", ["fail42"], then="join_bad"),
    "long_reason": lambda ctx: fail("a:" * 50_000),
    # too large: 9 MiB appended in one step (RUN_TRANSITION_MAX_BYTES is 8 MiB)
    "huge_append": lambda ctx: goto("after_bad", append={"notes": ["x" * (9 << 20)]}),
    # storable: an emoji (written as a surrogate pair) and text that only looks like escapes
    "fine": lambda ctx: goto("after_bad", update={"x": "😀 \\u0000 \\ud800 \ud83d\ude00"},
                             append={"notes": ["😀", "\\u0000"]}),
}
unstorable = Agent("unstorable", version=1, logs=["notes"],
                   retry=RetryPolicy(max_attempts=2, initial_backoff=0))


def _nested(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


@unstorable.step(start=True, next=["after_bad", "bad_branch", "join_bad"])
def produce(ctx, state):
    if state["how"] == "nul_error":
        raise ValueError("bad \x00 byte")
    return UNSTORABLE[state["how"]](ctx)


@unstorable.step(next=[])
def after_bad(ctx, state):
    return finish({"x": state.get("x"), "notes": list(state.log("notes"))})


@unstorable.step(next=[])
def bad_branch(ctx, state):
    return fail(42) if ctx.item == "fail42" else finish(float("nan"))


@unstorable.step(next=[])
def join_bad(ctx, state):
    return finish([[r.ok, r.error] for r in ctx.fan_out])
