"""Employee onboarding, the story the platform is built around: mostly waiting.

    welcome packet (email) -> signed documents (event docs.signed, key = employee email)
    -> IT provisioning (child run) -> manager approves the day-one schedule (inbox / Slack)
    -> hardware delivered (event hardware.delivered, key = employee email; on timeout IT is
       emailed and the run waits once more) -> day-one schedule (email)

Input: {"employee": {"name": str, "email": str}, "manager": str (optional decider),
        "it_email": str, "start_date": str, "hardware_timeout_seconds": float}
Emails go out through `ctx.effect(name, "email", to=, subject=, body=)`: recorded in the effect
ledger, sent once even if a worker dies mid-step.
"""

import hashlib
from datetime import timedelta

from runs.agents import Agent
from runs.transitions import fail, finish, goto, run_child, wait_for_approval, wait_for_event

INPUT_SCHEMA = {
    "type": "object",
    "required": ["employee"],
    "properties": {
        "employee": {"type": "object", "required": ["name", "email"], "properties": {
            "name": {"type": "string", "minLength": 1},
            "email": {"type": "string", "minLength": 3, "pattern": "^[^@\\s]+@[^@\\s]+$"}}},
        "manager": {"type": "string", "minLength": 1,
                    "description": "who decides the day-one schedule (user:<email>, an email "
                                   "or role:<role>); any approver when absent"},
        "it_email": {"type": "string", "minLength": 3},
        "role": {"type": "string"},
        "start_date": {"type": "string"},
        "hardware_timeout_seconds": {"type": "number", "exclusiveMinimum": 0},
    },
}
INPUT_EXAMPLE = {"employee": {"name": "Ada Lovelace", "email": "ada@example.com"},
                 "manager": "role:approver", "it_email": "it@example.com",
                 "start_date": "2026-01-05", "hardware_timeout_seconds": 259200}

onboarding = Agent("onboarding", version=1,
                   description="Welcome packet, signed documents, IT provisioning, the manager's "
                               "approval, hardware delivery, the day-one schedule.",
                   input_schema=INPUT_SCHEMA, input_example=INPUT_EXAMPLE)
MAX_SCHEDULE_REVISIONS = 3


def _employee(state) -> dict:
    return state["employee"]


def _hardware_timeout(state) -> timedelta:
    return timedelta(seconds=float(state.get("hardware_timeout_seconds", 3 * 24 * 3600)))


@onboarding.step(start=True, next=["provision"])
def send_welcome_packet(ctx, state):
    employee = _employee(state)
    ctx.effect("welcome_packet", "email", to=employee["email"],
               subject=f"Welcome aboard, {employee['name']}!",
               body=("Your welcome packet is attached. Please sign the contract and the policy "
                     "documents; we continue as soon as they are signed."))
    return wait_for_event("docs.signed", employee["email"], then="provision")


@onboarding.step(next=["plan_day_one"])
def provision(ctx, state):
    employee = _employee(state)
    return run_child("it_provisioning", {"employee": employee,
                                         "role": state.get("role", "engineer")},
                     then="plan_day_one",
                     update={"documents": state["event"]["payload"]})


@onboarding.step(next=["await_hardware"])
def plan_day_one(ctx, state):
    accounts = state.get("accounts")
    if accounts is None:  # first visit: the IT provisioning child just reported
        child = state["event"]["payload"]
        if child["status"] != "succeeded":
            return fail(f"IT provisioning {child['status']}: {child.get('error', '')}")
        accounts = child["result"]
    revision = state.get("schedule_revision", 0) + 1
    schedule = {"date": state.get("start_date", "first Monday"), "revision": revision,
                "09:00": "Welcome breakfast with the team", "10:00": "Laptop and accounts",
                "11:00": f"Meet your manager{' ' + state['manager'] if state.get('manager') else ''}",
                "14:00": "Onboarding buddy: codebase tour"}
    request = {"title": f"Day-one schedule for {_employee(state)['name']}",
               "body": "Approve the schedule, or reject it to have it revised.",
               "artifact": schedule}
    if state.get("manager"):
        request["deciders"] = [state["manager"]]
    return wait_for_approval(request, then="await_hardware",
                             update={"accounts": accounts, "schedule_revision": revision})


@onboarding.step(next=["send_day_one_schedule", "escalate_hardware", "plan_day_one"])
def await_hardware(ctx, state):
    decision = state["approval"]
    if not decision["approved"]:
        if state["schedule_revision"] >= MAX_SCHEDULE_REVISIONS:
            return fail(f"the day-one schedule was rejected {MAX_SCHEDULE_REVISIONS} times")
        return goto("plan_day_one", update={"rejection": decision})
    return wait_for_event("hardware.delivered", _employee(state)["email"],
                          then="send_day_one_schedule", timeout=_hardware_timeout(state),
                          on_timeout="escalate_hardware",
                          update={"schedule": decision["artifact"]})


@onboarding.step(next=["send_day_one_schedule"])
def escalate_hardware(ctx, state):
    employee = _employee(state)
    ctx.effect("hardware_escalation", "email", to=state.get("it_email", "it@example.com"),
               subject=f"Hardware for {employee['name']} has not arrived",
               body=(f"{employee['name']} ({employee['email']}) starts on "
                     f"{state.get('start_date', 'their first day')} and the hardware is not "
                     "delivered yet. Please chase the order."))
    # Wait once more; if it still does not come, day one goes ahead with a loaner.
    return wait_for_event("hardware.delivered", employee["email"], then="send_day_one_schedule",
                          timeout=_hardware_timeout(state), on_timeout="send_day_one_schedule",
                          update={"escalated": True, "timed_out": None})


@onboarding.step(next=[])
def send_day_one_schedule(ctx, state):
    employee = _employee(state)
    hardware = "waiting at your desk" if not state.get("timed_out") else \
        "not delivered yet: IT has a loaner laptop for you"
    lines = [f"{time}: {what}" for time, what in state["schedule"].items()
             if time not in ("date", "revision")]
    ctx.effect("day_one_schedule", "email", to=employee["email"],
               subject=f"Your first day: {state['schedule'].get('date')}",
               body="\n".join([f"Hi {employee['name']},", "", *lines, "",
                               f"Hardware: {hardware}."]))
    return finish({"employee": employee["email"], "accounts": state["accounts"],
                   "escalated": bool(state.get("escalated")),
                   "hardware": "delivered" if not state.get("timed_out") else "loaner"})


it_provisioning = Agent("it_provisioning", version=1,
                        description="Accounts, groups and a hardware order for a new employee.")


@it_provisioning.step(start=True, next=["assign_groups"])
def create_accounts(ctx, state):
    local = state["employee"]["email"].split("@")[0]
    return goto("assign_groups", update={"accounts": {"sso": local, "email": state["employee"]
                                                      ["email"], "chat": f"@{local}"}})


@it_provisioning.step(next=["order_hardware"])
def assign_groups(ctx, state):
    groups = ["everyone", f"role-{state.get('role', 'engineer')}"]
    return goto("order_hardware", update={"groups": groups})


@it_provisioning.step(next=[])
def order_hardware(ctx, state):
    digest = hashlib.sha256(state["employee"]["email"].encode()).hexdigest()
    order = f"HW-{int(digest[:8], 16) % 100000:05d}"  # deterministic: a re-run step agrees
    return finish({**state["accounts"], "groups": state["groups"], "hardware_order": order})
