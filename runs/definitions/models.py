"""Tenant-defined agents (tenant schema): every version of every definition, never changed
once written. A run pins (name, version); old versions stay while their runs drain."""

from django.db import models


class AgentDefinition(models.Model):
    name = models.CharField(max_length=63)
    version = models.PositiveIntegerField()
    spec = models.JSONField()  # the normalised definition (spec.definition_parse)
    spec_hash = models.CharField(max_length=64)
    created_by = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    # Retired definitions start no new runs; their runs still finish on their version.
    retired_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["name", "version"], name="agent_definition_version_unique"),
        ]
        indexes = [models.Index(fields=["name", "-version"], name="agent_definition_latest")]

    def __str__(self) -> str:
        return f"{self.name} v{self.version}"


class AgentLimitDefaults(models.Model):
    """The tenant's defaults for its agents' limits (at most one row; none: the platform's
    AGENT_DEFAULT_LIMITS). A definition's own limits win over these (limits.limits_effective)."""

    one = models.BooleanField(default=True, unique=True)  # the row, alone in its schema
    limits = models.JSONField(default=dict)  # spec.LIMITS keys, checked by agent_limits_set
    updated_by = models.CharField(max_length=200, blank=True, default="")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.CheckConstraint(condition=models.Q(one=True), name="agent_limit_defaults_one")]

    def __str__(self) -> str:
        return f"agent limit defaults {self.limits}"
