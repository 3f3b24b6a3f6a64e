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


class AgentLimits(models.Model):
    """The tenant's default limits for its agents (one row, or none): what a definition that
    sets no limit of its own runs with, before the platform's AGENT_DEFAULT_LIMITS."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1, editable=False)
    max_turns = models.PositiveIntegerField(null=True, blank=True)
    max_tokens = models.PositiveBigIntegerField(null=True, blank=True)
    max_cost_usd = models.FloatField(null=True, blank=True)
    max_wall_seconds = models.FloatField(null=True, blank=True)
    updated_by = models.CharField(max_length=200, blank=True, default="")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=models.Q(id=1), name="agent_limits_one_row"),
            models.CheckConstraint(condition=models.Q(max_turns__isnull=True) | models.Q(max_turns__gte=1),
                                   name="agent_limits_max_turns_positive"),
            models.CheckConstraint(condition=models.Q(max_tokens__isnull=True) | models.Q(max_tokens__gte=1),
                                   name="agent_limits_max_tokens_positive"),
            models.CheckConstraint(
                condition=models.Q(max_cost_usd__isnull=True) | models.Q(max_cost_usd__gt=0),
                name="agent_limits_max_cost_positive"),
            models.CheckConstraint(
                condition=models.Q(max_wall_seconds__isnull=True) | models.Q(max_wall_seconds__gt=0),
                name="agent_limits_max_wall_positive"),
        ]

    def __str__(self) -> str:
        return "agent limits"
