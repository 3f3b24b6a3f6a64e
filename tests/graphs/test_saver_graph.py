"""A compiled LangGraph graph runs on the sync saver made in a tenant's context: LangGraph writes
its checkpoints from background threads (durability "async"), each on that thread's own Django
connection, in the tenant's schema; the message list is stored a message at a time."""

import operator
import uuid
from typing import Annotated, TypedDict

from django.db import connection
from langgraph.graph import END, START, StateGraph

from agentplatform.langgraph import PlatformSaver


class Chat(TypedDict):
    messages: Annotated[list, operator.add]
    count: int


def talk(state: Chat) -> dict:
    return {"messages": [{"n": state["count"], "text": "x" * 150}], "count": state["count"] + 1}


def chat_graph(saver: PlatformSaver):
    builder = StateGraph(Chat)
    builder.add_node("talk", talk)
    builder.add_edge(START, "talk")
    builder.add_conditional_edges("talk", lambda s: "talk" if s["count"] < 40 else END, ["talk", END])
    return builder.compile(checkpointer=saver)


def test_a_graph_runs_on_the_saver_from_its_background_threads_and_resumes_from_it(in_acme):
    saver = PlatformSaver()
    saver.setup()  # as LangGraph's docs have it: nothing to do, the migrations made the tables
    graph = chat_graph(saver)
    config = {"configurable": {"thread_id": uuid.uuid4().hex}, "recursion_limit": 100}
    result = graph.invoke({"messages": [], "count": 0}, config, durability="async")
    assert result["count"] == 40 and len(result["messages"]) == 40

    again = chat_graph(PlatformSaver())  # another saver, as after a restart: nothing remembered
    assert again.get_state(config).values == result
    history = list(again.get_state_history(config))
    assert len(history) == 42  # the input, the first step, 40 loops
    assert [len(s.values.get("messages", [])) for s in history][:3] == [40, 39, 38]

    again.update_state(config, {"messages": [{"n": "by hand"}]})
    assert again.get_state(config).values["messages"] == [*result["messages"], {"n": "by hand"}]
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*), count(base_version) FROM graphs_blob "
                       "WHERE thread_id = %s AND channel = 'messages'", [config["configurable"]["thread_id"]])
        assert cursor.fetchone() == (42, 41)  # the input's [] whole, then a suffix per message
