"""A LangGraph agent on the platform: a ReAct loop over the model connector that reads an
invoice, pays it (a person approves first above `approval_above` cents) and emails the
requester. The graph is plain LangGraph; three things make it the platform's:

- `model()` and `effect()` (agentplatform.langgraph) go through the effect ledger: a node
  re-run after a crash gets the recorded answer, and the card is never charged twice;
- `interrupt(...)` parks the run in the approvals inbox, at no cost, until a person decides;
- `Agent.from_langgraph` registers it: one platform step per node, checkpoints in the tenant's
  schema, fenced on the run's lease.

Input: {"invoice": {"filename", "content"}, "requester": email, "model": model name}.
The tenant's model and payments credentials are those labelled `invoice-graph`; payments above
APPROVAL_ABOVE_CENTS wait for a person. Both are the operator's choice here, not the input's:
whoever may start a run must not be able to choose a higher threshold or another credential.
`make run` plays it against the scripted model server (deploy/demo/invoice-triage.script.json,
script "invoice-graph-script").
"""

import json
import operator
import re
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt

from agentplatform.langgraph import effect, model
from runs.agents import Agent

INSTRUCTIONS = (
    "You triage supplier invoices. The user message is JSON: an invoice file (filename and "
    "content) and the requester's email. Call read_invoice with the filename and content, then "
    "pay_invoice (amount in cents, currency, the payee account as customer, the invoice number "
    "and vendor as description), then email_requester with what happened. Then answer with one "
    "sentence.")
TOOLS = [
    {"type": "function", "function": {
        "name": "read_invoice", "description": "Read an invoice's fields (amount in cents).",
        "parameters": {"type": "object", "required": ["filename", "content"], "properties": {
            "filename": {"type": "string"}, "content": {"type": "string"}}}}},
    {"type": "function", "function": {
        "name": "pay_invoice", "description": "Pay an invoice; large ones wait for a person.",
        "parameters": {"type": "object", "required": ["amount", "currency", "customer"],
                       "properties": {"amount": {"type": "integer"},
                                      "currency": {"type": "string"},
                                      "customer": {"type": "string"},
                                      "description": {"type": "string"}}}}},
    {"type": "function", "function": {
        "name": "email_requester", "description": "Email the person who sent the invoice in.",
        "parameters": {"type": "object", "required": ["to", "subject", "body"], "properties": {
            "to": {"type": "string"}, "subject": {"type": "string"},
            "body": {"type": "string"}}}}},
]
INPUT_SCHEMA = {
    "type": "object",
    "required": ["invoice", "requester"],
    "properties": {
        "invoice": {"type": "object", "required": ["filename", "content"], "properties": {
            "filename": {"type": "string", "minLength": 1, "maxLength": 100},
            "content": {"type": "string", "minLength": 1, "maxLength": 20000}}},
        "requester": {"type": "string", "pattern": "^[^@\\s]+@[^@\\s]+$"},
        "model": {"type": "string", "minLength": 1},
    },
    "additionalProperties": False,
}
INPUT_EXAMPLE = {
    "invoice": {"filename": "INV-2041.txt",
                "content": "INVOICE\nNumber: INV-2041\nVendor: Northwind Office Supplies Ltd\n"
                           "Payee account: cus_northwind\nTotal due: EUR 1,250.00\n"},
    "requester": "ada@demo.test", "model": "invoice-graph-script",
}
MAX_TURNS = 8
APPROVAL_ABOVE_CENTS = 50000
CREDENTIAL = "invoice-graph"  # the label of the tenant's model and payments credentials
PAYMENT_FIELDS = ("amount", "currency", "customer", "description")


class InvoiceState(TypedDict, total=False):
    invoice: dict
    requester: str
    model: str
    messages: Annotated[list[dict], operator.add]


def think(state: InvoiceState) -> dict:
    """One model turn over the conversation so far."""
    opening = [] if state.get("messages") else [{"role": "user", "content": json.dumps(
        {"invoice": state["invoice"], "requester": state["requester"]})}]
    conversation = [{"role": "system", "content": INSTRUCTIONS},
                    *state.get("messages", []), *opening]
    reply = model(conversation, model=state.get("model"), tools=TOOLS, temperature=0,
                  credential=CREDENTIAL)
    said = {"role": "assistant", "content": reply.get("content") or ""}
    if reply.get("tool_calls"):
        said["tool_calls"] = reply["tool_calls"]
    return {"messages": [*opening, said]}


def act(state: InvoiceState) -> dict:
    """Answer the last turn's tool calls, in order."""
    results = []
    for call in state["messages"][-1]["tool_calls"]:
        name, arguments = call["function"]["name"], _arguments(call)
        answer = TOOL_FUNCTIONS.get(name, _unknown)(state, call["id"], arguments)
        results.append({"role": "tool", "tool_call_id": call["id"],
                        "content": json.dumps(answer, sort_keys=True)})
    return {"messages": results}


def next_after_think(state: InvoiceState) -> str:
    turns = sum(1 for message in state["messages"] if message["role"] == "assistant")
    return "act" if state["messages"][-1].get("tool_calls") and turns < MAX_TURNS else END


def read_invoice(state: InvoiceState, call_id: str, arguments: dict) -> dict:
    """The invoice's `Key: value` lines, with the total as amount (cents) and currency."""
    fields = {}
    for line in str(arguments.get("content", "")).splitlines():
        key, colon, value = line.partition(":")
        if colon and value.strip():
            fields[key.strip().lower().replace(" ", "_")] = value.strip()
    total = re.fullmatch(r"([A-Z]{3})\s+([0-9][0-9,]*)(?:\.([0-9]{2}))?", fields.get("total_due", ""))
    if total:
        fields["currency"] = total.group(1).lower()
        fields["amount"] = int(total.group(2).replace(",", "")) * 100 + int(total.group(3) or 0)
    return fields


def pay_invoice(state: InvoiceState, call_id: str, arguments: dict) -> dict:
    """Charge through the payments connector; above the threshold a person decides first
    (and may edit the arguments)."""
    charge = {key: arguments[key] for key in PAYMENT_FIELDS if key in arguments}
    if not isinstance(charge.get("amount"), int) or charge["amount"] <= 0:
        return {"error": "amount must be a positive whole number of cents"}
    if charge["amount"] > APPROVAL_ABOVE_CENTS:
        decision = interrupt({"title": f"Pay {charge['amount']} {charge.get('currency', '')} to "
                                       f"{charge.get('customer', '')}?",
                              "artifact": charge})
        if not decision["approved"]:
            return {"error": "a person rejected this payment; it was not made",
                    "by": decision.get("by"), "comment": decision.get("comment")}
        edited = decision.get("artifact")
        if edited is not None:  # as the decider left it: what they approved, checked again
            if not isinstance(edited, dict) or not isinstance(edited.get("amount"), int) \
                    or edited["amount"] <= 0:
                return {"error": "the approved payment has no valid amount; it was not made"}
            charge = {key: edited[key] for key in PAYMENT_FIELDS if key in edited}
    return effect(f"pay_invoice:{call_id}"[:200], "payments", credential=CREDENTIAL, **charge)


def email_requester(state: InvoiceState, call_id: str, arguments: dict) -> dict:
    return effect(f"email_requester:{call_id}"[:200], "email", to=state["requester"],
                  subject=str(arguments.get("subject", ""))[:200], body=str(arguments.get("body", "")))


def _unknown(state: InvoiceState, call_id: str, arguments: dict) -> dict:
    return {"error": "no such tool"}


def _arguments(call: dict) -> dict[str, Any]:
    try:
        arguments = json.loads(call["function"].get("arguments") or "{}")
    except ValueError:
        return {}
    return arguments if isinstance(arguments, dict) else {}


TOOL_FUNCTIONS = {"read_invoice": read_invoice, "pay_invoice": pay_invoice,
                  "email_requester": email_requester}


def build() -> StateGraph:
    graph = StateGraph(InvoiceState)
    graph.add_node("think", think)
    graph.add_node("act", act)
    graph.add_edge(START, "think")
    graph.add_conditional_edges("think", next_after_think, ["act", END])
    graph.add_edge("act", "think")
    return graph


invoice_graph = Agent.from_langgraph(
    "invoice-graph", 1, build,
    description="LangGraph ReAct loop: reads an invoice, pays it (a person approves large "
                "ones), emails the requester.",
    input_schema=INPUT_SCHEMA, input_example=INPUT_EXAMPLE)
