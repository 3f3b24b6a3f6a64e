"""Reading tenant-defined agents (current tenant's schema)."""

from django.conf import settings
from django.db.models import QuerySet

from .models import AgentDefinition, AgentLimits
from .spec import ACTIONS, AGENT_NAME, LIMITS


def definition_versions(*, name: str) -> QuerySet[AgentDefinition]:
    """Every version of one definition, newest first; none for a name no definition can have
    (checked here, once for every caller: a URL's NUL byte would not even reach PostgreSQL)."""
    if not isinstance(name, str) or not AGENT_NAME.fullmatch(name):
        return AgentDefinition.objects.none()
    return AgentDefinition.objects.filter(name=name).order_by("-version")


def definition_find(*, name: str, version: int | None = None) -> AgentDefinition | None:
    """One version, or the newest one that is not retired."""
    versions = definition_versions(name=name)
    if version is None:
        return versions.filter(retired_at__isnull=True).first()
    return versions.filter(version=version).first()


def definitions_latest() -> list[AgentDefinition]:
    """The newest version of each definition that is not retired, by name."""
    rows = AgentDefinition.objects.filter(retired_at__isnull=True).order_by("name", "-version")
    return list(rows.distinct("name"))


def definitions_naming(*, connector: str, label: str) -> list[AgentDefinition]:
    """The current versions (not retired) whose model or tools name this credential: what
    removing it would break."""
    found = []
    for row in definitions_latest():
        spec = row.spec
        named = {("model", spec.get("model", {}).get("credential"))}
        for tool in spec.get("tools", []):
            if tool.get("kind") == "connector":
                named.add((ACTIONS.get(tool.get("action"), ("",))[0], tool.get("credential")))
            elif tool.get("kind") == "mcp":
                named.add(("mcp", tool.get("server")))
        if (connector, label) in named:
            found.append(row)
    return found


def definitions_all() -> QuerySet[AgentDefinition]:
    return AgentDefinition.objects.order_by("name", "version")


def agent_limits_tenant() -> dict:
    """The limits this tenant set as defaults for its agents (only those it set)."""
    row = AgentLimits.objects.filter(id=1).first()
    if row is None:
        return {}
    return {key: getattr(row, key) for key in LIMITS if getattr(row, key) is not None}


def agent_limits_platform() -> dict:
    """The platform's defaults (settings.AGENT_DEFAULT_LIMITS; none where it is not set)."""
    return {key: value for key, value in settings.AGENT_DEFAULT_LIMITS.items()
            if key in LIMITS and value is not None}
