"""JSON Schemas written by tenants (an agent's input schema, a tool's parameters), checked and
applied without trusting them: `schema_problem(schema)` on write, `schema_errors(schema, value)`
wherever a value is validated (the web process at a run's start, a worker at each tool call).
Imports no app.

jsonschema, left to itself, fetches any `$ref` it cannot resolve in the document with urllib
(http://, https://, file://: a request to the cloud metadata address, a local file read, its
contents echoed back in error messages). Here a schema may refer only into itself ("#..."),
and the registry retrieves nothing, so a reference that slips past the check is an error, never
a request. A schema that refers to itself without end (`{"$ref": "#"}`) is an error too, not a
RecursionError in the caller.
"""

from typing import Any

import referencing
import referencing.exceptions
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from jsonschema.validators import SPECIFICATIONS

REFERENCE_KEYS = ("$ref", "$dynamicRef")


def _retrieve_nothing(uri: str):
    raise referencing.exceptions.NoSuchResource(ref=uri)


# The specifications' own meta-schemas (known by their URIs, bundled) and nothing fetched
REGISTRY = SPECIFICATIONS.combine(referencing.Registry(retrieve=_retrieve_nothing))


def schema_validator(schema: dict) -> Draft202012Validator:
    return Draft202012Validator(schema, registry=REGISTRY)


def schema_problem(schema: Any) -> str:
    """What is wrong with `schema` as a tenant's JSON Schema ("" when nothing)."""
    if not isinstance(schema, dict):
        return "must be a JSON Schema object"
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        return f"is not a valid JSON Schema: {exc.message}"
    except RecursionError:
        return "is nested too deeply"
    remote = _remote_reference(schema)
    if remote:
        return (f"refers to {remote!r}: a schema may refer only to its own parts (\"#/$defs/...\"); "
                "nothing is fetched")
    return ""


def schema_errors(schema: dict, value: Any) -> list[str]:
    """Where `value` breaks `schema`, one line per failure naming its path ("$.amount: ..."),
    in path order; a schema that cannot be applied to it is one line saying why."""
    try:
        errors = sorted(schema_validator(schema).iter_errors(value),
                        key=lambda e: list(map(str, e.absolute_path)))
    except referencing.exceptions.Unresolvable as exc:  # jsonschema wraps it in a subclass
        return [f"$: the schema has a reference that does not resolve: {exc}"]
    except RecursionError:
        return ["$: the schema refers to itself without end (or the value is nested too deeply)"]
    return [f"{e.json_path}: {e.message}" for e in errors]


def _remote_reference(schema: Any) -> str:
    """The first reference in `schema` that points outside it (not "#..."), else ""."""
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for key in REFERENCE_KEYS:
                reference = node.get(key)
                if isinstance(reference, str) and not reference.startswith("#"):
                    return reference
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return ""
