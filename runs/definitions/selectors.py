"""Reading tenant-defined agents (current tenant's schema)."""

from django.db.models import QuerySet

from .models import AgentDefinition, AgentLimitDefaults


def definition_versions(*, name: str) -> QuerySet[AgentDefinition]:
    """Every version of one definition, newest first."""
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


def definitions_all() -> QuerySet[AgentDefinition]:
    return AgentDefinition.objects.order_by("name", "version")


def agent_limits_tenant() -> dict:
    """This tenant's defaults for its agents' limits ({}: none, the platform's apply)."""
    row = AgentLimitDefaults.objects.filter(one=True).values_list("limits", flat=True).first()
    return dict(row or {})
