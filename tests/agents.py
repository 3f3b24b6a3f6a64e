"""Agents used only by the tests (registered in test processes and test workers alike)."""

import json
import urllib.request

from runs.agents import Agent, RetryPolicy
from runs.transitions import fail, fan_out, finish, goto, sleep

# -- a loop that appends one ~200-byte message per step -------------------------------------
chatter = Agent("chatter", version=1, logs=["messages"])


@chatter.step(start=True, next=["talk", "done"])
def talk(ctx, state):
    said = state.get("said", 0) + 1
    message = {"n": said, "text": f"message {said:06d} " + "x" * 180}
    nxt = "done" if said >= state["steps"] else "talk"
    return goto(nxt, update={"said": said}, append={"messages": [message]})


@chatter.step(next=[])
def done(ctx, state):
    return finish({"said": state["said"], "messages": len(state.log("messages"))})


# -- a step that fails its first `failures` attempts (counted per run in this process) ------
flaky = Agent("flaky", version=1, retry=RetryPolicy(max_attempts=3, initial_backoff=0.01))
ATTEMPTS: dict[str, int] = {}


@flaky.step(start=True, next=[])
def wobble(ctx, state):
    ATTEMPTS[str(ctx.run_id)] = ctx.attempt
    if ctx.attempt <= state["failures"]:
        raise ConnectionError(f"upstream refused attempt {ctx.attempt}")
    return finish({"attempts": ctx.attempt})


# -- steps that break the engine's rules -------------------------------------------------------
rulebreaker = Agent("rulebreaker", version=1)


@rulebreaker.step(start=True, next=["ok"])
def start(ctx, state):
    match state["how"]:
        case "undeclared":
            return goto("nowhere")
        case "too_big":
            return goto("ok", update={"notes": "y" * 300_000})
        case "not_a_transition":
            return {"oops": True}
        case "fails":
            return fail("the agent gave up")
    return goto("ok")


@rulebreaker.step(next=[])
def ok(ctx, state):
    return finish("ok")


# -- a step that reports to an HTTP receiver after the barrier ---------------------------------
notifier = Agent("notifier", version=1, logs=["sent"])


@notifier.step(start=True, next=["notify", "wrap_up"])
def notify(ctx, state):
    n = state.get("n", 0) + 1
    ctx.barrier()  # what ctx.effect does before anything leaves the process
    body = json.dumps({"run": str(ctx.run_id), "visit": ctx.visit, "n": n}).encode()
    urllib.request.urlopen(urllib.request.Request(state["url"], data=body, method="POST"),
                           timeout=10).read()
    return goto("wrap_up" if n >= state["count"] else "notify", update={"n": n},
                append={"sent": [n]})


@notifier.step(next=[])
def wrap_up(ctx, state):
    return finish(state["n"])


# -- a slow step, for cancellation and workers ---------------------------------------------------
slowpoke = Agent("slowpoke", version=1)


@slowpoke.step(start=True, next=["nap"])
def nap(ctx, state):
    import time

    time.sleep(state.get("seconds", 0.2))
    n = state.get("n", 0) + 1
    return finish(n) if n >= state.get("count", 1_000_000) else goto("nap", update={"n": n})


# -- fan-out: square each item on any worker, then sum in the join ----------------------------
fanner = Agent("fanner", version=1, logs=["squares"])


@fanner.step(start=True, next=["square", "total"])
def spread(ctx, state):
    return fan_out("square", list(range(state["count"])), then="total")


@fanner.step(next=[])
def square(ctx, state):
    import time

    time.sleep(state.get("seconds", 0))
    return finish(ctx.item * ctx.item)


@fanner.step(next=[])
def total(ctx, state):
    results = ctx.fan_out
    failed = [r.error for r in results if not r.ok]
    if failed:
        return fail(f"{len(failed)} branches failed: {failed[0]}")
    return finish({"branches": len(results), "total": sum(r.value for r in results)},
                  append={"squares": [r.value for r in results]})


# -- chatter's steps under a shallow retention policy (only the latest checkpoint is kept) ----
from datetime import timedelta  # noqa: E402

from runs.agents import RetentionPolicy  # noqa: E402

tidy = Agent("tidy", version=1, logs=["messages"],
             retention=RetentionPolicy(history="shallow", ttl=timedelta(days=1)))
tidy.step(start=True, next=["talk", "done"])(talk)
tidy.step(next=[])(done)


# -- a crash point for the retention tests: a worker SIGKILLs itself right after uploading the
# archive of the run named in the marker file (before the Archive row and the prune commit).
def _kill_after_upload(run_id) -> None:
    import os
    import signal
    from pathlib import Path

    marker = Path(__file__).resolve().parent.parent / ".dev" / "test-logs" / \
        f"kill-after-upload-{os.environ.get('TEST_SLOT', '0')}"
    if "celery" in " ".join(os.sys.argv) and marker.exists() and marker.read_text() == str(run_id):
        marker.unlink()
        os.kill(os.getpid(), signal.SIGKILL)


def _install_crash_point() -> None:
    from retention import services

    if services.after_upload is None:
        services.after_upload = _kill_after_upload


_install_crash_point()


# -- parking: approvals, events, sleeps and child runs -------------------------------------------
from runs.transitions import run_child, wait_for_approval, wait_for_event  # noqa: E402

waiter = Agent("waiter", version=1)


@waiter.step(start=True, next=["decided", "gave_up", "slept", "child_done", "event_seen"])
def ask(ctx, state):
    from datetime import timedelta

    timeout = timedelta(seconds=state["timeout"]) if state.get("timeout") else None
    match state["how"]:
        case "approval":
            return wait_for_approval({"title": "Ship it?", "artifact": {"plan": "v1"},
                                      "deciders": state.get("deciders", [])},
                                     then="decided", timeout=timeout,
                                     on_timeout="gave_up" if timeout else None)
        case "event":
            return wait_for_event(state["kind"], state["key"], then="event_seen",
                                  timeout=timeout, on_timeout="gave_up" if timeout else None)
        case "sleep":
            return sleep(then="slept", duration=timedelta(seconds=state["seconds"]))
        case "child":
            return run_child("research", {"topic": "child", "iterations": 2}, then="child_done")


@waiter.step(next=[])
def decided(ctx, state):
    return finish(state["approval"])


@waiter.step(next=[])
def gave_up(ctx, state):
    return finish({"timed_out": state["timed_out"]})


@waiter.step(next=[])
def slept(ctx, state):
    return finish("rested")


@waiter.step(next=[])
def child_done(ctx, state):
    return finish(state["event"]["payload"])


@waiter.step(next=[])
def event_seen(ctx, state):
    return finish(state["event"]["payload"])
