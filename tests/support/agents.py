"""Agents used only by the tests (registered in test processes and test workers alike)."""

import json
import time
import urllib.request

from runs.agents import Agent, RetryPolicy
from runs.transitions import fail, fan_out, finish, goto, sleep

# -- a loop that appends one ~200-byte message per step -------------------------------------
chatter = Agent("chatter", version=1, logs=["messages"])


@chatter.step(start=True, next=["talk", "done"])
def talk(ctx, state):
    time.sleep(state.get("pause", 0))  # a run long enough in time, however fast the machine
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

    marker = Path(__file__).resolve().parents[2] / ".dev" / "test-logs" / \
        f"kill-after-upload-{os.environ.get('TEST_SLOT', '0')}"
    if "celery" in " ".join(os.sys.argv) and marker.exists() and marker.read_text() == str(run_id):
        marker.unlink()
        os.kill(os.getpid(), signal.SIGKILL)


def _install_crash_point() -> None:
    from runs.retention import services

    if services.after_upload is None:
        services.after_upload = _kill_after_upload


_install_crash_point()


# -- parking: approvals, events, sleeps and child runs -------------------------------------------
from runs.transitions import run_child, wait_for_approval, wait_for_event  # noqa: E402

waiter = Agent("waiter", version=1)


@waiter.step(start=True, next=["decided", "gave_up", "slept", "child_done", "event_seen"])
def ask(ctx, state):
    from datetime import datetime, timedelta

    timeout = timedelta(seconds=state["timeout"]) if state.get("timeout") else None
    match state["how"]:
        case "approval":
            return wait_for_approval({"title": "Ship it?", "artifact": {"plan": "v1"},
                                      "deciders": state.get("deciders", [])},
                                     then="decided", timeout=timeout,
                                     on_timeout="gave_up" if timeout else None)
        case "event":
            since = datetime.fromisoformat(state["since"]) if state.get("since") else None
            return wait_for_event(state["kind"], state["key"], then="event_seen",
                                  timeout=timeout, on_timeout="gave_up" if timeout else None,
                                  since=since)
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


# -- effects: connectors to a local receiver (tests/effects/receiver.py), and agents using them -
import urllib.error  # noqa: E402

from integrations.connectors import (  # noqa: E402
    Connector,
    ConnectorError,
    Lookup,
    connector_register,
)
from integrations.connectors.base import Found  # noqa: E402


def _post(url: str, body: dict, key: str) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Idempotency-Key": key,
                                              "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:  # 503: refused at the door, nothing was acted on
        raise ConnectorError(f"receiver said {exc.code}", retryable=exc.code >= 500,
                             sent=exc.code >= 500 and exc.code != 503) from exc
    except OSError as exc:
        raise ConnectorError(f"receiver unreachable: {exc}", retryable=True, sent=True) from exc


class KeyedReceiver(Connector):
    """Like Stripe: deduplicates by our idempotency key."""

    name = "test_keyed"
    honours_idempotency_key = True

    def execute(self, call):
        return _post(call.args["url"], {**call.args, "run": str(call.run_id)}, call.idempotency_key)


class PlainReceiver(Connector):
    """Like SMTP or Slack: ignores keys; may be asked afterwards (lookup) if it can be."""

    name = "test_plain"

    def execute(self, call):
        return _post(call.args["url"], {**call.args, "run": str(call.run_id)}, call.idempotency_key)

    def lookup(self, call):
        if not call.args.get("searchable"):
            return Lookup.UNKNOWN
        url = call.args["url"].rsplit("/", 1)[0] + f"/lookup?key={call.idempotency_key}"
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                return Found(json.loads(response.read()))
        except urllib.error.HTTPError as exc:
            return Lookup.NOT_FOUND if exc.code == 404 else Lookup.UNKNOWN


connector_register(KeyedReceiver())
connector_register(PlainReceiver())

payer = Agent("payer", version=1, retry=RetryPolicy(max_attempts=3, initial_backoff=0.01))


@payer.step(start=True, next=["receipt"])
def charge(ctx, state):
    charged = ctx.effect("charge", state.get("connector", "test_keyed"), url=state["url"],
                         amount=state["amount"], searchable=state.get("searchable", False))
    ctx.notify("receipt-mail", "test_keyed", url=state["url"].rsplit("/", 1)[0] + "/notify",
               to="buyer@acme.test")
    if ctx.attempt < state.get("fail_attempts_after_effect", 0) + 1:
        raise RuntimeError("crashed after the charge, before the step ended")
    if state.get("reuse_name"):
        ctx.effect("charge", "test_keyed", url=state["url"], amount=state["amount"] + 1)
    return goto("receipt", update={"charge": charged})


@payer.step(next=[])
def receipt(ctx, state):
    return finish(state["charge"])


# -- 3 effects per run, for the random-kill soak ----------------------------------------------
triple = Agent("triple", version=1)


@triple.step(start=True, next=["second"])
def first(ctx, state):
    import time

    ctx.effect("one", "test_keyed", url=state["url"], n=1)
    time.sleep(state.get("seconds", 0))
    if marker := state.get("hold_while"):  # in flight, effect recorded: where a test kills
        from pathlib import Path

        once = Path(f"{marker}.{ctx.run_id}")  # held on its first claim only: a run killed
        if not once.exists():  # again and again would rightly be parked as a poison step
            once.touch()
            deadline = time.monotonic() + 120
            while Path(marker).exists() and time.monotonic() < deadline:
                time.sleep(0.05)
    return goto("second")


@triple.step(next=["third"])
def second(ctx, state):
    import time

    ctx.effect("two", "test_keyed", url=state["url"], n=2)
    time.sleep(state.get("seconds", 0))
    return goto("third")


@triple.step(next=[])
def third(ctx, state):
    return finish(ctx.effect("three", "test_keyed", url=state["url"], n=3))


# -- the real connectors, for crash tests ------------------------------------------------------
worldly = Agent("worldly", version=1, retry=RetryPolicy(max_attempts=5, initial_backoff=0.5))


@worldly.step(start=True, next=["after"])
def act(ctx, state):
    import time

    match state["what"]:
        case "pay":
            result = ctx.effect("charge", "payments", amount=state.get("amount", 1999),
                                currency="usd", source="tok_visa")
        case "mail":
            result = ctx.effect("welcome", "email", to="new.hire@acme.test",
                                subject="Welcome aboard", body="Your first day is Monday.")
        case "think":
            result = ctx.model([{"role": "user", "content": "plan the first day"}],
                               model="gpt-test", max_tokens=state.get("max_tokens", 50))
    if marker := state.get("pause_while"):  # the window a test kills the worker in
        from pathlib import Path

        deadline = time.monotonic() + 30
        while Path(marker).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    return goto("after", update={"result": result})


@worldly.step(next=["after"])
def after(ctx, state):
    if state["what"] == "think" and state.get("think_again"):
        second = ctx.model([{"role": "user", "content": "and the second day"}],
                           model="gpt-test", max_tokens=state.get("max_tokens", 50))
        return finish({"first": state["result"], "second": second})
    return finish(state["result"])


# -- cancel and fork: a run cancelled as it parks, a tree of child runs, a fan-out whose join
# asks for an approval --------------------------------------------------------------------------
parker = Agent("parker", version=1)


@parker.step(start=True, next=["after", "square"])
def park_cancelled(ctx, state):
    """Asks for its own cancel (as a person would, mid-step), then parks as told."""
    from datetime import timedelta

    from runs.services import run_cancel

    run_cancel(run_id=ctx.run_id)
    match state["how"]:
        case "approval":
            return wait_for_approval({"title": "Ship it?"}, then="after")
        case "event":
            return wait_for_event("docs.signed", str(ctx.run_id), then="after")
        case "sleep":
            return sleep(then="after", duration=timedelta(hours=1))
        case "child":
            return run_child("waiter", {"how": "approval"}, then="after")
        case "fan_out":
            return fan_out("square", [1, 2], then="after")


parker.step(next=[])(square)


@parker.step(next=[], name="after")
def ran_after_the_wait(ctx, state):
    return finish("ran after the wait")


nest = Agent("nest", version=1)


@nest.step(start=True, next=["nested"])
def descend(ctx, state):
    """depth > 0: start a child one level down and wait for it; depth 0: wait for a person."""
    if state["depth"] > 0:
        return run_child("nest", {"depth": state["depth"] - 1}, then="nested")
    return wait_for_approval({"title": f"leaf of {state.get('root', 'a tree')}"}, then="nested")


@nest.step(next=[])
def nested(ctx, state):
    return finish(state.get("event", {}).get("payload") or state.get("approval"))


fan_ask = Agent("fan_ask", version=1)


@fan_ask.step(start=True, next=["held", "ask"])
def spread_out(ctx, state):
    return fan_out("held", [0, 1], then="ask")


@fan_ask.step(next=[])
def held(ctx, state):
    """Branch 1 holds until the test removes its marker file."""
    import time
    from pathlib import Path

    deadline = time.monotonic() + 60
    while ctx.item == 1 and Path(state["marker"]).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return finish(ctx.item * 10)


@fan_ask.step(next=["asked"], name="ask")
def ask_after_join(ctx, state):
    return wait_for_approval({"title": "Use these results?"}, then="asked")


@fan_ask.step(next=[])
def asked(ctx, state):
    return finish([r.value for r in ctx.fan_out])


# -- three steps that each notify (ctx.notify) a receiver: the outbox under load ---------------
herald = Agent("herald", version=1)


def _announce(ctx, state, n: int) -> None:
    ctx.notify(f"note-{n}", state.get("connector", "test_keyed"), url=state["url"], n=n,
               searchable=state.get("searchable", False))


@herald.step(start=True, next=["second_note"])
def first_note(ctx, state):
    _announce(ctx, state, 1)
    return finish("announced") if state.get("notes", 3) == 1 else goto("second_note")


@herald.step(next=["third_note"])
def second_note(ctx, state):
    _announce(ctx, state, 2)
    return goto("third_note")


@herald.step(next=[])
def third_note(ctx, state):
    _announce(ctx, state, 3)
    return finish("announced")
