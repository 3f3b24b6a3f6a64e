"""The definition language of tenant-defined agents: the JSON a tenant writes, checked on write
and read into frozen dataclasses the runner interprets. Pure: no database, no network; what
must be looked up (the tenant's credentials, the operator's agent names) is passed in.

    {"description": "Pays small invoices, asks above 500",
     "model": {"credential": "default", "name": "gpt-4o-mini", "temperature": 0, "max_tokens": 1024},
     "instructions": "You triage invoices ...",
     "input_schema": {"type": "object", "required": ["invoice"], ...},
     "tools": [
       {"name": "pay", "kind": "connector", "action": "payments.charge",
        "approval": {"argument": "amount", "above": 500}},
       {"name": "read_file", "kind": "sandbox", "language": "bash"},
       {"name": "wait_paid", "kind": "wait_for_event", "event": "invoice.paid",
        "key_argument": "invoice_id"},
       {"name": "ask", "kind": "wait_for_approval"},
       {"name": "search", "kind": "mcp", "server": "docs", "remote_name": "search"}],
     "limits": {"max_turns": 20, "max_tokens": 200000, "max_cost_usd": 5, "max_wall_seconds": 3600}}

`definition_parse` returns a `Definition` or raises `DefinitionInvalid` whose `fields` map a
path in the JSON ("tools[2].approval") to what is wrong there.
"""

import difflib
import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from agentplatform.schemas import schema_errors, schema_problem

AGENT_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
TOOL_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")  # what OpenAI and Anthropic accept
MAX_SPEC_BYTES = 256 * 1024
MAX_TOOLS = 64
MAX_INSTRUCTIONS = 50_000
MAX_TOKENS_PER_TURN = 32_768
MAX_TURNS = 1_000
EVENT_KIND_MAX = 64  # an event gate's kind column (runs.approvals.models.EventGate)

# A connector action a tool may name: (connector, default argument schema).
ACTIONS: dict[str, tuple[str, dict]] = {
    "email.send": ("email", {
        "type": "object", "required": ["to", "subject", "body"], "additionalProperties": False,
        "properties": {"to": {"type": "string"}, "subject": {"type": "string"},
                       "body": {"type": "string"}}}),
    "slack.post": ("slack", {
        "type": "object", "required": ["channel", "text"], "additionalProperties": False,
        "properties": {"channel": {"type": "string"}, "text": {"type": "string"}}}),
    # The credential's url by default: a model that picks the url (a prompt injection can make
    # it) could send signed payloads anywhere. A tool whose parameters name `url` lets it.
    "webhook.post": ("webhook", {
        "type": "object", "required": ["payload"], "additionalProperties": False,
        "properties": {"payload": {"type": "object"}}}),
    "payments.charge": ("payments", {
        "type": "object", "required": ["amount", "currency", "customer"],
        "additionalProperties": False,
        "properties": {"amount": {"type": "integer", "minimum": 1},
                       "currency": {"type": "string", "minLength": 3, "maxLength": 3},
                       "customer": {"type": "string"}, "description": {"type": "string"}}}),
}
KINDS = ("connector", "sandbox", "wait_for_event", "wait_for_approval", "mcp")
SANDBOX_LANGUAGES = ("bash", "python")
RULE_OPERATORS = ("above", "at_least", "below", "equals", "in")
LIMITS = {"max_turns": int, "max_tokens": int, "max_cost_usd": float, "max_wall_seconds": float}
# What a run's columns hold (Run.max_cost_usd is numeric(12, 6), max_tokens a bigint): a larger
# limit would be a database error at run_start, not a run.
LIMIT_MAXIMUMS = {"max_turns": MAX_TURNS, "max_tokens": 10 ** 15, "max_cost_usd": 999_999,
                  "max_wall_seconds": 10 * 366 * 86400}

SANDBOX_PARAMETERS = {"type": "object", "required": ["script"], "additionalProperties": False,
                      "properties": {"script": {"type": "string", "description": "the script to run"}}}
WAIT_FOR_APPROVAL_PARAMETERS = {
    "type": "object", "required": ["question"], "additionalProperties": False,
    "properties": {"question": {"type": "string", "description": "what to ask the person"},
                   "artifact": {"description": "what the person approves, and may edit"}}}
ANY_OBJECT = {"type": "object"}
# ctx.effect(name, connector, credential=..., **arguments): an argument by one of these names
# would be a TypeError in the worker (a crashed step, not an answer the model reads)
EFFECT_KEYWORDS = {"name", "connector", "credential"}


class DefinitionInvalid(ValueError):
    """The definition cannot be stored: `fields` maps a path in it to what is wrong there."""

    def __init__(self, fields: dict[str, list[str]]):
        self.fields = fields
        first = next(iter(fields.items()))
        super().__init__(f"{first[0]}: {first[1][0]}" if len(fields) == 1
                         else f"{len(fields)} fields are invalid, first {first[0]}: {first[1][0]}")


@dataclass(frozen=True)
class Approval:
    """When a tool call waits for a person: never, always, or when an argument passes a rule."""

    mode: str = "never"  # never | always | rule
    argument: str = ""  # a dotted path into the arguments ("invoice.amount")
    operator: str = ""  # one of RULE_OPERATORS
    value: Any = None

    def needed(self, arguments: dict) -> bool:
        """Whether a call with these arguments waits for a person. A rule whose argument is
        missing or of the wrong type asks: a rule exists to stop calls, not to let them by."""
        if self.mode != "rule":
            return self.mode == "always"
        found, value = _lookup(arguments, self.argument)
        if not found or (isinstance(value, float) and not math.isfinite(value)):
            return True  # NaN passes no comparison; JSON's NaN and 1e999 parse to floats
        if self.operator == "equals":
            return value == self.value
        if self.operator == "in":
            return value in self.value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return True
        return {"above": value > self.value, "at_least": value >= self.value,
                "below": value < self.value}[self.operator]

    def as_json(self) -> Any:
        if self.mode != "rule":
            return self.mode
        return {"argument": self.argument, self.operator: self.value}


@dataclass(frozen=True)
class Tool:
    name: str
    kind: str  # one of KINDS
    description: str
    parameters: dict  # JSON Schema of the arguments the model passes
    approval: Approval = field(default_factory=Approval)
    # kind-specific settings: action, connector, credential (connector); language, command
    # (sandbox); event, key_argument, timeout_seconds (wait_for_event); deciders,
    # timeout_seconds (wait_for_approval); server, remote_name (mcp)
    options: dict = field(default_factory=dict)

    def argument_errors(self, arguments: Any) -> list[str]:
        """Where `arguments` break the tool's parameter schema (`$.amount: ...`), one per line."""
        if not isinstance(arguments, dict):
            return ["$: arguments must be a JSON object"]
        if self.kind == "connector":  # they travel as ctx.effect's keywords, beside its own
            taken = sorted(set(arguments) & EFFECT_KEYWORDS)
            if taken:
                return [f"$.{key}: not an argument a tool may pass (the definition chooses it)"
                        for key in taken]
        return schema_errors(self.parameters, arguments)

    @property
    def function(self) -> dict:
        """The tool as the model sees it (Chat Completions' `tools[]` entry)."""
        return {"type": "function", "function": {
            "name": self.name, "description": self.description, "parameters": self.parameters}}


@dataclass(frozen=True)
class ModelSettings:
    credential: str  # label of the tenant's `model` credential; its api_format picks the wire format
    name: str
    temperature: float | None = None
    max_tokens: int = 1024  # per turn


@dataclass(frozen=True)
class Definition:
    name: str
    model: ModelSettings
    instructions: str
    tools: tuple[Tool, ...]
    limits: dict  # LIMITS keys that are set
    description: str = ""
    input_schema: dict | None = None
    input_example: dict | None = None
    spec: dict = field(default_factory=dict, compare=False)  # the normalised JSON, as stored

    def tool(self, name: str) -> Tool | None:
        return next((t for t in self.tools if t.name == name), None)

    @property
    def spec_hash(self) -> str:
        return spec_hash(self.spec)


def spec_hash(spec: dict) -> str:
    canonical = json.dumps(spec, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


class _Errors:
    def __init__(self):
        self.fields: dict[str, list[str]] = {}

    def add(self, path: str, message: str) -> None:
        self.fields.setdefault(path, []).append(message)

    def raise_any(self) -> None:
        if self.fields:
            raise DefinitionInvalid(self.fields)


def definition_parse(name: str, spec: Any, *, credentials: set[tuple[str, str]] | None = None,
                     reserved_names: set[str] = frozenset()) -> Definition:
    """Check `spec` and read it. `credentials`: the tenant's (connector, label) pairs, each
    credential a tool or the model names must be among them (None: not checked, as when a
    stored version is read back); `reserved_names`: the operator's agent names."""
    errors = _Errors()
    if not isinstance(name, str) or not AGENT_NAME.match(name):
        errors.add("name", "must be 1-63 lowercase letters, digits, '-' or '_', starting with a letter")
    elif name in reserved_names:
        errors.add("name", f"{name!r} is the name of one of the platform's agents")
    if not isinstance(spec, dict):
        errors.add("definition", "must be a JSON object")
        errors.raise_any()
    if len(json.dumps(spec)) > MAX_SPEC_BYTES:
        errors.add("definition", f"is larger than {MAX_SPEC_BYTES} bytes")
        errors.raise_any()
    known = {"description", "model", "instructions", "input_schema", "input_example", "tools", "limits"}
    for key in sorted(set(spec) - known):
        errors.add(key, f"unknown field{_did_you_mean(key, known)}; a definition has {sorted(known)}")
    description = _string(errors, spec, "description", "description", default="", limit=2_000)
    instructions = _string(errors, spec, "instructions", "instructions", limit=MAX_INSTRUCTIONS)
    model = _model(errors, spec.get("model"), credentials)
    input_schema = spec.get("input_schema")
    if input_schema is not None:
        _schema(errors, "input_schema", input_schema)
    input_example = spec.get("input_example")
    if input_example is not None and not isinstance(input_example, dict):
        errors.add("input_example", "must be a JSON object")
    elif input_example is not None and isinstance(input_schema, dict) and "input_schema" not in errors.fields:
        for problem in schema_errors(input_schema, input_example):
            errors.add("input_example", f"does not match input_schema: {problem}")
    tools = _tools(errors, spec.get("tools", []), credentials)
    limits = _limits(errors, spec.get("limits", {}))
    errors.raise_any()
    normal = {"description": description, "model": _model_json(model), "instructions": instructions,
              "tools": [_tool_json(t) for t in tools], "limits": limits}
    if input_schema is not None:
        normal["input_schema"] = input_schema
    if input_example is not None:
        normal["input_example"] = input_example
    return Definition(name=name, model=model, instructions=instructions, tools=tuple(tools),
                      limits=limits, description=description, input_schema=input_schema,
                      input_example=input_example, spec=normal)


def _string(errors, data, key, path, *, default=None, limit):
    value = data.get(key, default)
    if not isinstance(value, str) or (default is None and not value.strip()):
        errors.add(path, "is required and must be a non-empty string" if default is None
                   else "must be a string")
        return ""
    if len(value) > limit:
        errors.add(path, f"is longer than {limit} characters")
    return value


def _schema(errors, path, schema) -> bool:
    problem = schema_problem(schema)  # no remote $ref: nothing a tenant writes is fetched
    if problem:
        errors.add(path, problem)
        return False
    return True


def _model(errors, data, credentials) -> ModelSettings:
    if not isinstance(data, dict):
        errors.add("model", "is required: {credential, name, temperature, max_tokens}")
        return ModelSettings(credential="default", name="")
    known = {"credential", "name", "temperature", "max_tokens"}
    for key in sorted(set(data) - known):
        errors.add(f"model.{key}", f"unknown field{_did_you_mean(key, known)}; a model has {sorted(known)}")
    credential = data.get("credential", "default")
    if not isinstance(credential, str) or not credential:
        errors.add("model.credential", "must be the label of a model credential")
    elif credentials is not None and ("model", credential) not in credentials:
        errors.add("model.credential", f"this tenant has no model credential labelled {credential!r}")
    name = data.get("name")
    if not isinstance(name, str) or not name.strip() or len(name) > 200:
        errors.add("model.name", "is required: the provider's model name")
    temperature = data.get("temperature")
    if temperature is not None and (isinstance(temperature, bool) or not isinstance(temperature, (int, float))
                                    or not 0 <= temperature <= 2):
        errors.add("model.temperature", "must be a number from 0 to 2")
    max_tokens = data.get("max_tokens", 1024)
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) \
            or not 1 <= max_tokens <= MAX_TOKENS_PER_TURN:
        errors.add("model.max_tokens", f"must be an integer from 1 to {MAX_TOKENS_PER_TURN}")
    return ModelSettings(credential=credential if isinstance(credential, str) else "default",
                         name=name if isinstance(name, str) else "",
                         temperature=temperature if isinstance(temperature, (int, float)) else None,
                         max_tokens=max_tokens if isinstance(max_tokens, int) else 1024)


def _model_json(model: ModelSettings) -> dict:
    out = {"credential": model.credential, "name": model.name, "max_tokens": model.max_tokens}
    if model.temperature is not None:
        out["temperature"] = model.temperature
    return out


TOOL_FIELDS = {
    "connector": {"action", "credential"},
    "sandbox": {"language", "command"},
    "wait_for_event": {"event", "key_argument", "timeout_seconds"},
    "wait_for_approval": {"deciders", "timeout_seconds"},
    "mcp": {"server", "remote_name"},
}
COMMON_FIELDS = {"name", "kind", "description", "parameters", "approval"}


def _tools(errors, data, credentials) -> list[Tool]:
    if not isinstance(data, list):
        errors.add("tools", "must be a list")
        return []
    if len(data) > MAX_TOOLS:
        errors.add("tools", f"has more than {MAX_TOOLS} tools")
        return []
    tools, seen = [], {}
    for index, item in enumerate(data):
        path = f"tools[{index}]"
        if not isinstance(item, dict):
            errors.add(path, "must be an object")
            continue
        tool = _tool(errors, path, item, credentials)
        if tool is None:
            continue
        if tool.name in seen:
            errors.add(f"{path}.name", f"{tool.name!r} is already the name of tools[{seen[tool.name]}]")
            continue
        seen[tool.name] = index
        tools.append(tool)
    return tools


def _tool(errors, path, item, credentials) -> Tool | None:
    before = len(errors.fields)
    name = item.get("name")
    if not isinstance(name, str) or not TOOL_NAME.match(name):
        errors.add(f"{path}.name", "must be 1-64 letters, digits, '-' or '_', starting with a letter")
    kind = item.get("kind")
    if kind not in KINDS:
        errors.add(f"{path}.kind", f"must be one of {list(KINDS)}")
        return None
    known = COMMON_FIELDS | TOOL_FIELDS[kind]
    for key in sorted(set(item) - known):
        errors.add(f"{path}.{key}", f"unknown field for a {kind} tool{_did_you_mean(key, known)}; "
                                    f"it has {sorted(known)}")
    description = item.get("description", "")
    if not isinstance(description, str) or len(description) > 4_000:
        errors.add(f"{path}.description", "must be a string of at most 4000 characters")
    options: dict[str, Any] = {}
    default_parameters = ANY_OBJECT
    if kind == "connector":
        action = item.get("action")
        if action not in ACTIONS:
            errors.add(f"{path}.action", f"unknown connector action; known: {sorted(ACTIONS)}")
        else:
            connector, default_parameters = ACTIONS[action]
            credential = item.get("credential", "default")
            if not isinstance(credential, str) or not credential:
                errors.add(f"{path}.credential", "must be a credential label")
            elif credentials is not None and (connector, credential) not in credentials:
                errors.add(f"{path}.credential",
                           f"this tenant has no {connector!r} credential labelled {credential!r}")
            options = {"action": action, "connector": connector, "credential": credential}
    elif kind == "sandbox":
        language = item.get("language", "bash")
        if language not in SANDBOX_LANGUAGES:
            errors.add(f"{path}.language", f"must be one of {list(SANDBOX_LANGUAGES)}")
        command = item.get("command")
        if command is not None and (not isinstance(command, str) or not command.strip()
                                    or len(command) > 20_000):
            errors.add(f"{path}.command", "must be a non-empty script of at most 20000 characters")
        options = {"language": language}
        if command is not None:
            options["command"] = command  # fixed: the model's arguments reach it as .tool/arguments.json
        else:
            default_parameters = SANDBOX_PARAMETERS
    elif kind == "wait_for_event":
        event, key_argument = item.get("event"), item.get("key_argument")
        if not isinstance(event, str) or not event or len(event) > EVENT_KIND_MAX:
            errors.add(f"{path}.event", "is required: the kind of event to wait for (at most "
                                        f"{EVENT_KIND_MAX} characters)")
        if not isinstance(key_argument, str) or not key_argument:
            errors.add(f"{path}.key_argument", "is required: the argument whose value is the event's key")
        options = {"event": event, "key_argument": key_argument}
        if isinstance(key_argument, str):
            default_parameters = {"type": "object", "required": [key_argument],
                                  "properties": {key_argument: {"type": "string"}}}
        _timeout(errors, path, item, options)
    elif kind == "wait_for_approval":
        deciders = item.get("deciders", [])
        if not isinstance(deciders, list) or not all(isinstance(d, str) and d for d in deciders):
            errors.add(f"{path}.deciders", "must be a list of user:<email>, emails or role:<role>")
        options = {"deciders": deciders if isinstance(deciders, list) else []}
        default_parameters = WAIT_FOR_APPROVAL_PARAMETERS
        _timeout(errors, path, item, options)
    elif kind == "mcp":
        server = item.get("server")
        if not isinstance(server, str) or not server:
            errors.add(f"{path}.server", "is required: the label of the tenant's mcp credential")
        elif credentials is not None and ("mcp", server) not in credentials:
            errors.add(f"{path}.server", f"this tenant has no mcp credential labelled {server!r}")
        remote = item.get("remote_name", name)
        if not isinstance(remote, str) or not remote or len(remote) > 200:
            errors.add(f"{path}.remote_name", "must be the tool's name on the MCP server")
        options = {"server": server, "remote_name": remote}
    parameters = item.get("parameters", default_parameters)
    parameters_valid = _schema(errors, f"{path}.parameters", parameters)
    if parameters_valid and parameters.get("type", "object") != "object":
        errors.add(f"{path}.parameters", "must describe an object (\"type\": \"object\")")
    approval = _approval(errors, f"{path}.approval", item.get("approval", "never"), kind)
    # Checked on write only (credentials given): a version stored before this check existed
    # must still read back, and its calls still wait for a person when the argument is missing.
    if parameters_valid and approval.mode == "rule" and approval.argument and credentials is not None:
        problem = _rule_problem(approval, parameters)
        if problem:
            errors.add(f"{path}.approval.argument", problem)
    if len(errors.fields) > before:
        return None
    return Tool(name=name, kind=kind, description=description, parameters=parameters,
                approval=approval, options=options)


def _timeout(errors, path, item, options) -> None:
    timeout = item.get("timeout_seconds")
    if timeout is None:
        return
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= 366 * 86400:
        errors.add(f"{path}.timeout_seconds", "must be a number of seconds, above 0 and at most a year")
    else:
        options["timeout_seconds"] = timeout


def _approval(errors, path, data, kind) -> Approval:
    if data in ("never", "always"):
        if data == "always" and kind in ("wait_for_event", "wait_for_approval"):
            errors.add(path, f"a {kind} tool already waits; its approval must be 'never'")
        return Approval(mode=data)
    if not isinstance(data, dict):
        errors.add(path, "must be 'never', 'always' or a rule {\"argument\": \"amount\", \"above\": 500}")
        return Approval()
    if "argument" not in data:
        errors.add(f"{path}.argument", "is required: a rule names the argument it looks at "
                                       "({\"argument\": \"amount\", \"above\": 500})")
        return Approval()
    operators = [key for key in data if key != "argument"]
    argument = data["argument"]
    if not isinstance(argument, str) or not argument:
        errors.add(f"{path}.argument", "must name an argument (a dotted path for nested ones)")
    if len(operators) != 1 or operators[0] not in RULE_OPERATORS:
        errors.add(path, f"a rule has 'argument' and exactly one of {list(RULE_OPERATORS)}")
        return Approval()
    operator = operators[0]
    value = data[operator]
    numeric = not isinstance(value, bool) and isinstance(value, (int, float))
    if operator in ("above", "at_least", "below") and not numeric:
        errors.add(f"{path}.{operator}", "must be a number")
    if operator == "in" and not isinstance(value, list):
        errors.add(f"{path}.in", "must be a list of values")
    return Approval(mode="rule", argument=argument if isinstance(argument, str) else "",
                    operator=operator, value=value)


def _rule_problem(approval: Approval, parameters: dict) -> str:
    """Why a rule cannot hold as written: its argument is not among the tool's declared
    parameters (a typo would make every call wait for a person), or a number is compared with
    an argument declared as something else. Parameters that declare no properties: unknown."""
    schema: Any = parameters
    for part in approval.argument.split("."):
        properties = schema.get("properties") if isinstance(schema, dict) else None
        if not isinstance(properties, dict) or not properties:
            return ""
        if part not in properties:
            return (f"{approval.argument!r} is not one of the tool's parameters "
                    f"({', '.join(sorted(map(str, properties)))}){_did_you_mean(part, properties)}: "
                    "a rule on an argument the model never passes would ask a person for every "
                    "call (declare it in parameters if it is one)")
        schema = properties[part]
    declared = schema.get("type") if isinstance(schema, dict) else None
    declared = [declared] if isinstance(declared, str) else declared
    if approval.operator in ("above", "at_least", "below") and isinstance(declared, list) \
            and declared and not {"integer", "number"} & set(declared):
        return (f"{approval.operator.replace('_', ' ')} compares numbers, but the parameters declare "
                f"{approval.argument!r} as {' or '.join(map(str, declared))}")
    return ""


def _did_you_mean(key: str, known) -> str:
    close = difflib.get_close_matches(str(key), sorted(map(str, known)), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _tool_json(tool: Tool) -> dict:
    out = {"name": tool.name, "kind": tool.kind, "description": tool.description,
           "parameters": tool.parameters, "approval": tool.approval.as_json()}
    out.update({k: v for k, v in tool.options.items() if k != "connector"})
    return out


def limits_problems(limits: Any) -> dict[str, list[str]]:
    """Where a set of limits (a definition's, or a tenant's defaults) is wrong, by path
    ("limits.max_turns"); a null limit is no limit of this layer's."""
    if not isinstance(limits, dict):
        return {"limits": [f"must be an object with any of {sorted(LIMITS)}"]}
    problems: dict[str, list[str]] = {}
    for key, value in limits.items():
        kind = LIMITS.get(key)
        if kind is None:
            problems[f"limits.{key}"] = [f"unknown limit; known: {sorted(LIMITS)}"]
        elif value is None:
            continue
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0 \
                or (kind is int and not isinstance(value, int)):
            problems[f"limits.{key}"] = ["must be a positive " + ("integer" if kind is int else "number")]
        elif value > LIMIT_MAXIMUMS[key]:
            problems[f"limits.{key}"] = [f"must be at most {LIMIT_MAXIMUMS[key]}"]
    return problems


def _limits(errors, data) -> dict:
    for path, messages in limits_problems(data).items():
        for message in messages:
            errors.add(path, message)
    if not isinstance(data, dict):
        return {}
    return {key: value for key, value in data.items() if value is not None and key in LIMITS}


def _lookup(arguments: Any, path: str) -> tuple[bool, Any]:
    value = arguments
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return False, None
        value = value[part]
    return True, value
