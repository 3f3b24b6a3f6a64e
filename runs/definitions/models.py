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
