"""LangGraph graphs registered as agents, used only by the tests (tests/graphs)."""

import operator
import time
from typing import Annotated, TypedDict

from langgraph.config import get_config
from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt

from agentplatform.langgraph import effect
from runs.agents import Agent, RetryPolicy


# -- a loop whose node posts a webhook, then takes its time ------------------------------------
class PingState(TypedDict, total=False):
    count: int
    seconds: float
    fail_at: int  # the ping that raises once, after posting (per thread, in this process)
    n: int
    pings: Annotated[list, operator.add]


FAILED_ONCE: set[tuple[str, int]] = set()


def ping(state: PingState) -> dict:
    n = state.get("n", 0) + 1
    answer = effect("ping", "webhook", payload={"n": n})  # keyed on this task: once
    time.sleep(state.get("seconds", 0))  # a worker killed now has posted, not checkpointed
    thread = get_config()["configurable"]["thread_id"]
    if state.get("fail_at") == n and (thread, n) not in FAILED_ONCE:
        FAILED_ONCE.add((thread, n))
        raise ConnectionError("the node fails once after its effect")
    return {"n": n, "pings": [answer["status"]]}


def more(state: PingState) -> str:
    return "ping" if state["n"] < state["count"] else END


def pinger_graph() -> StateGraph:
    graph = StateGraph(PingState)
    graph.add_node("ping", ping)
    graph.add_edge(START, "ping")
    graph.add_conditional_edges("ping", more, ["ping", END])
    return graph


Agent.from_langgraph("graph-pinger", 1, pinger_graph)


# -- two nodes in one superstep (LangGraph runs one of them in an executor thread) ------------
class FanState(TypedDict, total=False):
    posted: Annotated[list, operator.add]


def left(state: FanState) -> dict:
    return {"posted": [effect("post", "webhook", payload={"side": "left"})["status"]]}


def right(state: FanState) -> dict:
    return {"posted": [effect("post", "webhook", payload={"side": "right"})["status"]]}


def fan_graph() -> StateGraph:
    graph = StateGraph(FanState)
    graph.add_node("left", left)
    graph.add_node("right", right)
    graph.add_edge(START, "left")
    graph.add_edge(START, "right")
    graph.add_edge(["left", "right"], END)
    return graph


Agent.from_langgraph("graph-fan", 1, fan_graph)


# -- a node that asks a person (or waits on an event), then acts --------------------------------
class AskState(TypedDict, total=False):
    order: str
    wait: str  # "approval" (default) or "event"
    answers: Annotated[list, operator.add]


def ask(state: AskState) -> dict:
    if state.get("wait") == "event":
        answer = interrupt({"wait_for_event": {"kind": "order.paid", "key": state["order"]}})
    else:
        answer = interrupt({"title": f"Ship order {state['order']}?",
                            "artifact": {"order": state["order"]}})
    return {"answers": [answer]}


def ask_again(state: AskState) -> dict:
    first = interrupt({"title": "First question?"})
    second = interrupt({"title": "Second question?"})
    return {"answers": [first, second]}


def asker_graph() -> StateGraph:
    graph = StateGraph(AskState)
    graph.add_node("ask", ask)
    graph.add_node("ask_again", ask_again)
    graph.add_edge(START, "ask")
    graph.add_edge("ask", "ask_again")
    graph.add_edge("ask_again", END)
    return graph


Agent.from_langgraph("graph-asker", 1, asker_graph,
                     retry=RetryPolicy(max_attempts=1))


# -- an interrupt nobody answers in time ------------------------------------------------------
def hurry(state: AskState) -> dict:
    return {"answers": [interrupt({"title": "Quick?", "timeout_seconds": 0.2})]}


def patient_graph() -> StateGraph:
    graph = StateGraph(AskState)
    graph.add_node("hurry", hurry)
    graph.add_edge(START, "hurry")
    graph.add_edge("hurry", END)
    return graph


Agent.from_langgraph("graph-patient", 1, patient_graph)


# -- a loop that only appends: a message per superstep ---------------------------------------
class ChatterState(TypedDict, total=False):
    steps: int
    said: Annotated[list, operator.add]


def say(state: ChatterState) -> dict:
    return {"said": [f"message {len(state.get('said', [])) + 1:06d}"]}


def chatter_graph() -> StateGraph:
    graph = StateGraph(ChatterState)
    graph.add_node("say", say)
    graph.add_edge(START, "say")
    graph.add_conditional_edges(
        "say", lambda state: "say" if len(state["said"]) < state["steps"] else END, ["say", END])
    return graph


Agent.from_langgraph("graph-chatter", 1, chatter_graph)
