"""Template filters of the agent definition pages: a stored tool's source and approval rule in
words, as the form names them."""

from django import template

from ..typed_json import json_shown

register = template.Library()


@register.filter
def tool_source(tool: dict) -> str:
    kind = tool.get("kind", "")
    if kind == "connector":
        return f"{tool.get('action')} (credential {tool.get('credential', 'default')})"
    if kind == "sandbox":
        return f"sandbox ({tool.get('language', 'bash')})" + (", fixed script" if tool.get("command") else "")
    if kind == "wait_for_event":
        return f"waits for the event {tool.get('event')} keyed by {tool.get('key_argument')}"
    if kind == "wait_for_approval":
        deciders = ", ".join(tool.get("deciders") or []) or "anyone who may decide"
        return f"asks a person ({deciders})"
    if kind == "mcp":
        return f"MCP server {tool.get('server')}, tool {tool.get('remote_name', tool.get('name'))}"
    return kind


@register.filter
def approval_words(approval) -> str:
    if approval == "always":
        return "always: a person approves every call"
    if isinstance(approval, dict):
        operator = next((key for key in approval if key != "argument"), "")
        return (f"when {approval.get('argument')} {operator.replace('_', ' ')} "
                f"{json_shown(approval.get(operator))}")
    return "never"
