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

from functools import lru_cache
from typing import Any

import re2
import referencing
import referencing.exceptions
from jsonschema import Draft202012Validator, ValidationError
from jsonschema.exceptions import SchemaError
from jsonschema.validators import SPECIFICATIONS, extend

REFERENCE_KEYS = ("$ref", "$dynamicRef")


def _retrieve_nothing(uri: str):
    raise referencing.exceptions.NoSuchResource(ref=uri)


# The specifications' own meta-schemas (known by their URIs, bundled) and nothing fetched
REGISTRY = SPECIFICATIONS.combine(referencing.Registry(retrieve=_retrieve_nothing))



class PatternUnsupported(ValueError):
    """A pattern RE2 does not run (a backreference, lookaround) or that does not compile."""


PATTERN_MEMORY = 1 << 20  # bytes RE2 may use per pattern (its default is 8 MiB): past it, refused
PATTERNS_CACHED = 256  # compiled patterns a process keeps: at most PATTERN_MEMORY each


@lru_cache(maxsize=PATTERNS_CACHED)
def _pattern(source: str):
    options = re2.Options()
    options.log_errors = False  # a tenant's bad pattern is their 400, not our stderr
    options.max_mem = PATTERN_MEMORY
    try:
        return re2.compile(source, options)
    except re2.error as exc:
        raise PatternUnsupported(str(exc)) from None


def _pattern_keyword(validator, pattern, instance, schema):
    if not validator.is_type(instance, "string"):
        return
    try:
        matched = _pattern(pattern).search(instance)
    except PatternUnsupported as exc:
        yield ValidationError(f"the pattern {pattern!r} cannot be applied: {exc}")
        return
    if not matched:
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


TenantValidator = extend(Draft202012Validator, validators={"pattern": _pattern_keyword})


def schema_validator(schema: dict) -> Draft202012Validator:
    return TenantValidator(schema, registry=REGISTRY)


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
    return _walk_problem(schema)


def schema_errors(schema: dict, value: Any) -> list[str]:
    """Where `value` breaks `schema`, one line per failure naming its path ("$.amount: ..."),
    in path order; a schema that cannot be applied to it is one line saying why."""
    problem = _walk_problem(schema)  # a schema stored before a check existed is checked here too
    if problem:
        return [f"$: the schema cannot be applied: it {problem}"]
    try:
        errors = sorted(schema_validator(schema).iter_errors(value),
                        key=lambda e: list(map(str, e.absolute_path)))
    except referencing.exceptions.Unresolvable as exc:  # jsonschema wraps it in a subclass
        return [f"$: the schema has a reference that does not resolve: {exc}"]
    except RecursionError:
        return ["$: the schema refers to itself without end (or the value is nested too deeply)"]
    return [f"{e.json_path}: {e.message}" for e in errors]


def _walk_problem(schema: Any) -> str:
    """The first reference outside `schema` (not "#..."), pattern RE2 cannot run, or
    patternProperties in it, said as what is wrong; else ""."""
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for key in REFERENCE_KEYS:
                reference = node.get(key)
                if isinstance(reference, str) and not reference.startswith("#"):
                    return (f"refers to {reference!r}: a schema may refer only to its own parts "
                            "(\"#/$defs/...\"); nothing is fetched")
            pattern = node.get("pattern")
            if isinstance(pattern, str):
                try:
                    _pattern(pattern)
                except PatternUnsupported as exc:
                    return (f"has the pattern {pattern!r}, which cannot run here (no backreferences "
                            f"or lookaround: patterns run in linear time): {exc}")
            if isinstance(node.get("patternProperties"), dict):
                return ("uses patternProperties, which is not supported: use propertyNames with "
                        "a pattern, and additionalProperties")
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return ""
