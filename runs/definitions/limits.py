"""The limits a tenant's agent runs under: the definition's own, else the tenant's defaults
(`AgentLimitDefaults`, set by `services.agent_limits_set`), else the platform's
(`AGENT_DEFAULT_LIMITS`). Pure: the caller reads the tenant's row."""

from collections.abc import Mapping
from typing import Any

from django.conf import settings

from .spec import LIMITS, MAX_TURNS


def limits_effective(definition_limits: Mapping[str, Any],
                     tenant_defaults: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Every limit in spec.LIMITS that applies: the definition's where it sets one, else the
    tenant's default, else the platform's; a limit nobody sets is absent (the run's own
    defaults, e.g. Run.max_wall_seconds, then apply)."""
    limits: dict[str, Any] = {}
    for layer in (settings.AGENT_DEFAULT_LIMITS, tenant_defaults or {}, definition_limits):
        for key, value in layer.items():
            if key in LIMITS and value is not None:
                limits[key] = value
    return limits


def limits_problems(limits: object) -> dict[str, list[str]]:
    """Where a set of limits (a tenant's defaults) is wrong, by field ("limits.max_turns");
    the same rules as a definition's `limits` (null: no default of the tenant's for that key)."""
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
        elif key == "max_turns" and value > MAX_TURNS:
            problems["limits.max_turns"] = [f"must be at most {MAX_TURNS}"]
    return problems
