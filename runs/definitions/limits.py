"""The limits a tenant's agent runs under: the definition's own, else the tenant's defaults
(`AgentLimits`, set by `services.agent_limits_set`), else the platform's
(`AGENT_DEFAULT_LIMITS`). Pure: the caller reads the tenant's row."""

from collections.abc import Mapping
from typing import Any

from django.conf import settings

from .spec import LIMITS


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
