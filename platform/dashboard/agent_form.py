"""The form that writes a tenant's agent definition (runs/definitions/spec.py) without
JavaScript: one form for the definition's own fields and one per tool (prefix `tool-<n>`),
read from a plain POST. Adding a tool is a submit button that re-renders the form with one more
row of the chosen kind (its parameters prefilled with the kind's default schema); removing one
is a button per row.

`DefinitionForms.spec()` is the JSON the services check; `errors_place(fields)` puts each of
`DefinitionError.fields` next to its input ("tools[2].approval" on the third row's approval
rule), and anything it cannot place above the form, with its path, so no error goes unshown."""

import json
import re
from typing import Any

from django import forms
from django.core.exceptions import ValidationError

from runs.definitions.spec import (
    ACTIONS,
    LIMITS,
    RULE_OPERATORS,
    SANDBOX_PARAMETERS,
    WAIT_FOR_APPROVAL_PARAMETERS,
)

from .typed_json import json_shown, json_typed

MAX_TOOL_ROWS = 64  # spec.MAX_TOOLS: a POST claiming more rows is read up to this
TOOL_PATH = re.compile(r"^tools\[(\d+)\](?:\.(.+))?$")
KIND_LABELS = {"connector": "connector action", "sandbox": "sandbox", "wait_for_event": "wait for an event",
               "wait_for_approval": "ask a person", "mcp": "MCP server tool"}


def tool_sources(credentials: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """What a tool may be made of in this tenant: each connector action whose connector has a
    credential (once per label), the sandbox, the two waits, and each `mcp` credential."""
    sources = []
    for action, (connector, _) in sorted(ACTIONS.items()):
        for kind, label in credentials:
            if kind == connector:
                sources.append((f"connector:{action}:{label}", f"{action} (credential {label})"))
    sources += [("sandbox:bash", "Sandbox: bash"), ("sandbox:python", "Sandbox: python"),
                ("wait_for_event", "Wait for an event"), ("wait_for_approval", "Ask a person (approval)")]
    sources += [(f"mcp:{label}", f"MCP server {label}") for kind, label in credentials if kind == "mcp"]
    return sources


def default_parameters(source: str) -> dict | None:
    """The parameter schema a new tool of `source` starts with (None: the spec derives it)."""
    kind, _, rest = source.partition(":")
    if kind == "connector":
        return ACTIONS.get(rest.partition(":")[0], (None, None))[1]
    return {"sandbox": SANDBOX_PARAMETERS, "wait_for_approval": WAIT_FOR_APPROVAL_PARAMETERS,
            "mcp": {"type": "object"}}.get(kind)


def _json_field(label: str, *, rows: int = 6, help_text: str = "") -> forms.CharField:
    return forms.CharField(label=label, required=False, help_text=help_text,
                           widget=forms.Textarea(attrs={"rows": rows, "spellcheck": "false"}))


def _json_object(text: str, *, what: str) -> dict | None:
    text = text.strip()
    if not text:
        return None
    value = json_typed(text)
    if not isinstance(value, dict):
        raise ValidationError(f"The {what} must be a JSON object ({{...}}).")
    return value


class DefinitionForm(forms.Form):
    name = forms.CharField(max_length=63, help_text="Lowercase letters, digits, '-' or '_', starting "
                           "with a letter. It cannot be changed later.")
    description = forms.CharField(required=False, max_length=2000,
                                  widget=forms.Textarea(attrs={"rows": 2}))
    model_credential = forms.ChoiceField(label="Model credential")
    model_name = forms.CharField(label="Model name", max_length=200)
    temperature = forms.FloatField(required=False, min_value=0, max_value=2,
                                   help_text="0 to 2; empty: the provider's default.")
    max_tokens = forms.IntegerField(label="Max tokens per turn", initial=1024, min_value=1)
    instructions = forms.CharField(widget=forms.Textarea(attrs={"rows": 8}),
                                   help_text="The system prompt.")
    input_schema = _json_field("Input schema (JSON Schema)", help_text="Empty: any JSON object.")
    input_example = _json_field("Example input (JSON)", rows=4,
                                help_text="Shown in the start form; must match the schema.")
    max_turns = forms.IntegerField(label="Max turns", required=False, min_value=1)
    limit_tokens = forms.IntegerField(label="Max tokens per run", required=False, min_value=1)
    max_cost_usd = forms.FloatField(label="Max cost (USD)", required=False, min_value=0)
    max_wall_seconds = forms.FloatField(label="Max wall time (seconds)", required=False, min_value=0)

    def __init__(self, *args, model_credentials: list[str], editing: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["model_credential"].choices = [(label, label) for label in model_credentials]
        if editing:
            self.fields["name"].disabled = True
            self.fields["name"].help_text = "A new version keeps the name."

    def clean_input_schema(self):
        return _json_object(self.cleaned_data["input_schema"], what="input schema")

    def clean_input_example(self):
        return _json_object(self.cleaned_data["input_example"], what="example input")


class ToolForm(forms.Form):
    source = forms.CharField(widget=forms.HiddenInput)
    name = forms.CharField(max_length=64, help_text="What the model calls it: letters, digits, '-', '_'.")
    description = forms.CharField(required=False, max_length=4000, widget=forms.Textarea(attrs={"rows": 2}))
    parameters = _json_field("Parameters (JSON Schema)", rows=8,
                             help_text="The arguments the model passes. Empty: the kind's default.")
    approval = forms.ChoiceField(label="Approval", initial="never", choices=[
        ("never", "Never: the call runs at once"), ("always", "Always: a person approves every call"),
        ("rule", "When an argument matches the rule below")])
    rule_argument = forms.CharField(label="Rule: argument", required=False, max_length=200,
                                    help_text="A dotted path for nested ones (invoice.amount).")
    rule_operator = forms.ChoiceField(label="Rule: operator", required=False, initial="above",
                                      choices=[(op, op.replace("_", " ")) for op in RULE_OPERATORS])
    rule_value = forms.CharField(label="Rule: value", required=False, max_length=2000,
                                 help_text='JSON: 500, "EUR" or ["a", "b"] (for in); a bare word is text.')
    # kind-specific settings, shown for their kind only
    command = forms.CharField(label="Fixed script (optional)", required=False,
                              widget=forms.Textarea(attrs={"rows": 3, "spellcheck": "false"}),
                              help_text="Empty: the model writes the script (argument <code>script</code>).")
    event = forms.CharField(label="Event kind", required=False, max_length=100)
    key_argument = forms.CharField(label="Key argument", required=False, max_length=200,
                                   help_text="The argument whose value is the event's key.")
    deciders = forms.CharField(label="Deciders", required=False, max_length=2000,
                               help_text="One a line: user:&lt;email&gt;, an email or role:&lt;role&gt;; "
                                         "empty: anyone who may decide.")
    timeout_seconds = forms.FloatField(label="Timeout (seconds)", required=False, min_value=0)
    remote_name = forms.CharField(label="Name on the MCP server", required=False, max_length=200)

    SHOWN = {"connector": (), "sandbox": ("command",),
             "wait_for_event": ("event", "key_argument", "timeout_seconds"),
             "wait_for_approval": ("deciders", "timeout_seconds"), "mcp": ("remote_name",)}

    @property
    def kind(self) -> str:
        return str(self["source"].value() or "").partition(":")[0]

    @property
    def source_label(self) -> str:
        kind, _, rest = str(self["source"].value() or "").partition(":")
        if kind == "connector":
            action, _, label = rest.partition(":")
            return f"{action} (credential {label})"
        if kind == "sandbox":
            return f"sandbox ({rest})"
        if kind == "mcp":
            return f"MCP server {rest}"
        return KIND_LABELS.get(kind, kind)

    @property
    def kind_fields(self) -> list:
        return [self[name] for name in self.SHOWN.get(self.kind, ())]

    @property
    def rule_fields(self) -> list:
        return [self["rule_argument"], self["rule_operator"], self["rule_value"]]

    def clean_parameters(self):
        return _json_object(self.cleaned_data["parameters"], what="parameters schema")

    def clean_rule_value(self):
        text = self.cleaned_data["rule_value"].strip()
        if not text:
            return None
        try:
            return json_typed(text)
        except ValidationError:
            if text[:1] in "[{\"" or text[:1].isdigit() or text[:1] == "-":
                raise  # meant as JSON: say why it is not
            return text  # a bare word: the text itself

    def clean(self):
        data = super().clean()
        if data.get("approval") == "rule":
            if not data.get("rule_argument"):
                self.add_error("rule_argument", "A rule names the argument it looks at.")
            if data.get("rule_value") is None and "rule_value" not in self.errors:
                self.add_error("rule_value", "A rule compares the argument with a value.")
        return data

    def tool_json(self) -> dict:
        data = self.cleaned_data
        kind, _, rest = data["source"].partition(":")
        tool: dict[str, Any] = {"name": data["name"], "kind": kind, "description": data["description"]}
        if kind == "connector":
            action, _, label = rest.partition(":")
            tool.update(action=action, credential=label)
        elif kind == "sandbox":
            tool["language"] = rest
            if data["command"].strip():
                tool["command"] = data["command"]
        elif kind == "wait_for_event":
            tool.update(event=data["event"], key_argument=data["key_argument"])
        elif kind == "wait_for_approval":
            tool["deciders"] = [line.strip() for line in data["deciders"].splitlines() if line.strip()]
        elif kind == "mcp":
            tool["server"] = rest
            if data["remote_name"]:
                tool["remote_name"] = data["remote_name"]
        if kind in ("wait_for_event", "wait_for_approval") and data.get("timeout_seconds") is not None:
            tool["timeout_seconds"] = _number(data["timeout_seconds"])
        if data["parameters"] is not None:
            tool["parameters"] = data["parameters"]
        if data["approval"] == "rule":
            tool["approval"] = {"argument": data["rule_argument"], data["rule_operator"]: data["rule_value"]}
        else:
            tool["approval"] = data["approval"]
        return tool


# Where a DefinitionError path lands: the definition's fields, then a tool row's.
DEFINITION_PATHS = {
    "name": "name", "description": "description", "instructions": "instructions",
    "input_schema": "input_schema", "input_example": "input_example",
    "model.credential": "model_credential", "model.name": "model_name",
    "model.temperature": "temperature", "model.max_tokens": "max_tokens",
    "limits.max_turns": "max_turns", "limits.max_tokens": "limit_tokens",
    "limits.max_cost_usd": "max_cost_usd", "limits.max_wall_seconds": "max_wall_seconds",
}
TOOL_PATHS = {
    "name": "name", "description": "description", "parameters": "parameters", "approval": "approval",
    "approval.argument": "rule_argument", "command": "command", "event": "event",
    "key_argument": "key_argument", "deciders": "deciders", "timeout_seconds": "timeout_seconds",
    "remote_name": "remote_name",
    **{f"approval.{op}": "rule_value" for op in RULE_OPERATORS},
}


class DefinitionForms:
    """The definition's form and its tool rows, bound to a POST or filled from a stored spec."""

    def __init__(self, *, credentials: list[tuple[str, str]], data=None, spec: dict | None = None,
                 name: str = "", editing: bool = False):
        self.credentials = credentials
        self.sources = tool_sources(credentials)
        self.editing = editing
        model_credentials = sorted(label for kind, label in credentials if kind == "model")
        self.model_credentials = model_credentials
        kwargs = {"model_credentials": model_credentials, "editing": editing}
        self.tools_errors: list[str] = []
        if data is not None:
            self.definition = DefinitionForm(data, **kwargs, initial={"name": name} if editing else None)
            try:
                count = min(max(int(data.get("tool_count", 0)), 0), MAX_TOOL_ROWS)
            except ValueError:
                count = 0
            self.tools = [ToolForm(data, prefix=f"tool-{i}") for i in range(count)]
        else:
            self.definition = DefinitionForm(initial=_definition_initial(name, spec or {}), **kwargs)
            self.tools = [ToolForm(initial=_tool_initial(tool), prefix=f"tool-{i}")
                          for i, tool in enumerate((spec or {}).get("tools", []))]

    # -- re-rendering with a row more or less, without judging what is half typed ---------------

    def rows_changed(self, *, add: str | None = None, remove: int | None = None) -> "DefinitionForms":
        """The same typed values, unbound (no errors shown), with a row of `add` appended or row
        `remove` taken out."""
        values = {name: field.value() for name, field in
                  ((n, self.definition[n]) for n in self.definition.fields)}
        rows = [{name: form[name].value() for name in form.fields} for form in self.tools]
        if remove is not None and 0 <= remove < len(rows):
            del rows[remove]
        if add is not None and len(rows) < MAX_TOOL_ROWS:
            schema = default_parameters(add)
            rows.append({"source": add, "approval": "never", "rule_operator": "above",
                         "name": _suggested_name(add, rows),
                         "parameters": json_shown(schema, indent=2) if schema else ""})
        fresh = DefinitionForms(credentials=self.credentials, editing=self.editing)
        fresh.definition = DefinitionForm(initial=values, model_credentials=self.model_credentials,
                                          editing=self.editing)
        fresh.tools = [ToolForm(initial=row, prefix=f"tool-{i}") for i, row in enumerate(rows)]
        return fresh

    # -- reading and judging ---------------------------------------------------------------------

    def is_valid(self) -> bool:
        valid = self.definition.is_valid()
        for form in self.tools:
            valid = form.is_valid() and valid
        known = {value for value, _ in self.sources}
        for form in self.tools:
            if form.is_bound and form.cleaned_data.get("source") not in known:
                form.add_error(None, "This tenant has no such connector credential or MCP server any more.")
                valid = False
        return valid

    def spec(self) -> dict:
        data = self.definition.cleaned_data
        model: dict[str, Any] = {"credential": data["model_credential"], "name": data["model_name"],
                                 "max_tokens": data["max_tokens"]}
        if data.get("temperature") is not None:
            model["temperature"] = _number(data["temperature"])
        limits = {key: _number(data[field]) for key, field in (("max_turns", "max_turns"),
                  ("max_tokens", "limit_tokens"), ("max_cost_usd", "max_cost_usd"),
                  ("max_wall_seconds", "max_wall_seconds")) if data.get(field) is not None}
        spec: dict[str, Any] = {"description": data["description"], "model": model,
                                "instructions": data["instructions"],
                                "tools": [form.tool_json() for form in self.tools], "limits": limits}
        if data["input_schema"] is not None:
            spec["input_schema"] = data["input_schema"]
        if data["input_example"] is not None:
            spec["input_example"] = data["input_example"]
        return spec

    def errors_place(self, fields: dict[str, list[str]]) -> None:
        """Each error of DefinitionError.fields next to its input; the rest above the form."""
        for path, problems in fields.items():
            for problem in problems:
                self._place(path, problem)

    def _place(self, path: str, problem: str) -> None:
        if path in DEFINITION_PATHS:
            self.definition.add_error(DEFINITION_PATHS[path], problem)
            return
        if path == "tools":
            self.tools_errors.append(problem)
            return
        match = TOOL_PATH.match(path)
        if match and int(match.group(1)) < len(self.tools):
            form, rest = self.tools[int(match.group(1))], match.group(2)
            if rest in TOOL_PATHS:
                form.add_error(TOOL_PATHS[rest], problem)
            else:  # the tool itself, its kind, action, credential or server: the row's own
                form.add_error(None, f"{rest}: {problem}" if rest else problem)
            return
        self.definition.add_error(None, f"{path}: {problem}")

    @property
    def errors_count(self) -> int:
        return (len(self.definition.errors) + sum(len(f.errors) for f in self.tools)
                + len(self.tools_errors))


def _number(value: float | int) -> float | int:
    """0.0 as 0: the same definition typed here or sent to the API has the same hash (JSON
    writes 0.0 and 0 differently), so saving it unchanged makes no new version."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _suggested_name(source: str, rows: list[dict]) -> str:
    kind, _, rest = source.partition(":")
    base = {"connector": rest.partition(":")[0].replace(".", "_"), "sandbox": f"run_{rest}",
            "mcp": "mcp_tool"}.get(kind, kind)
    base = re.sub(r"[^A-Za-z0-9_-]", "_", base) or "tool"
    taken = {row.get("name") for row in rows}
    name, n = base, 2
    while name in taken:
        name, n = f"{base}_{n}", n + 1
    return name


def _definition_initial(name: str, spec: dict) -> dict:
    model = spec.get("model", {})
    limits = spec.get("limits", {})
    initial = {"name": name, "description": spec.get("description", ""),
               "model_credential": model.get("credential"), "model_name": model.get("name", ""),
               "temperature": model.get("temperature"), "max_tokens": model.get("max_tokens", 1024),
               "instructions": spec.get("instructions", ""),
               "max_turns": limits.get("max_turns"), "limit_tokens": limits.get("max_tokens"),
               "max_cost_usd": limits.get("max_cost_usd"), "max_wall_seconds": limits.get("max_wall_seconds")}
    for key in ("input_schema", "input_example"):
        if spec.get(key) is not None:
            initial[key] = json_shown(spec[key], indent=2)
    return initial


def _tool_initial(tool: dict) -> dict:
    kind = tool.get("kind", "")
    source = {"connector": f"connector:{tool.get('action')}:{tool.get('credential', 'default')}",
              "sandbox": f"sandbox:{tool.get('language', 'bash')}", "mcp": f"mcp:{tool.get('server')}"
              }.get(kind, kind)
    initial = {"source": source, "name": tool.get("name", ""), "description": tool.get("description", ""),
               "parameters": json_shown(tool["parameters"], indent=2) if "parameters" in tool else "",
               "command": tool.get("command", ""), "event": tool.get("event", ""),
               "key_argument": tool.get("key_argument", ""),
               "deciders": "\n".join(tool.get("deciders", [])),
               "timeout_seconds": tool.get("timeout_seconds"), "remote_name": tool.get("remote_name", "")}
    approval = tool.get("approval", "never")
    if isinstance(approval, dict):
        operator = next((key for key in approval if key != "argument"), "above")
        value = approval.get(operator)
        initial.update(approval="rule", rule_argument=approval.get("argument", ""), rule_operator=operator,
                       rule_value=json.dumps(value, ensure_ascii=False))
    else:
        initial["approval"] = approval
    return initial


assert set(LIMITS) == {"max_turns", "max_tokens", "max_cost_usd", "max_wall_seconds"}
