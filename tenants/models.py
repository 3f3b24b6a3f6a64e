"""Tenants and what lives beside them in the public schema: API keys, wrapped data keys, and the
audit log of staff looking into a tenant's runs."""

import uuid

from django.contrib.postgres.fields import ArrayField
from django.db import models
from django_tenants.models import DomainMixin, TenantMixin


class Tenant(TenantMixin):
    class Status(models.TextChoices):
        ACTIVE = "active"
        SUSPENDED = "suspended"
        DELETING = "deleting"  # tenant_delete began: never active again, only deleted

    name = models.CharField(max_length=200)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.ACTIVE)
    created_at = models.DateTimeField(auto_now_add=True)
    provisioned_at = models.DateTimeField(null=True, blank=True)  # schema created and migrated
    # Runs (and fan-out branches) handed to workers at once; empty: RUN_TENANT_MAX_IN_FLIGHT.
    max_in_flight = models.PositiveIntegerField(null=True, blank=True)
    # The console shows this tenant's runs (and outbox) to superusers only; other staff get 404.
    superusers_only = models.BooleanField(
        default=False, help_text="Only superusers may see this tenant's runs in the console.")
    # Schemas are created explicitly by tenant_create (it also migrates them).
    auto_create_schema = False
    auto_drop_schema = True

    class Meta:
        constraints = [
            models.CheckConstraint(condition=models.Q(status__in=["active", "suspended", "deleting"]),
                                   name="tenant_status_known"),
        ]

    def __str__(self) -> str:
        return self.schema_name

    @property
    def is_active(self) -> bool:
        return self.status == self.Status.ACTIVE


class Domain(DomainMixin):
    """Required by django-tenants; tenants are chosen by API key, so only public has one."""


class Scope(models.TextChoices):
    """What an API key may do; every API endpoint declares the scopes it needs (docs/api.md)."""

    RUNS_READ = "runs:read"
    RUNS_WRITE = "runs:write"
    APPROVALS_DECIDE = "approvals:decide"
    EVENTS_WRITE = "events:write"
    ADMIN = "admin"  # credentials, connections and keys


def scopes_all() -> list[str]:
    return list(Scope.values)


class ApiKey(models.Model):
    """An API key: `ap_<prefix>_<secret>`. Only the SHA-256 of the whole key is stored."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=100, default="default")
    prefix = models.CharField(max_length=16, unique=True)
    key_hash = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    # No default: a key is made with the scopes asked for (api_key_create), never more.
    scopes = ArrayField(models.CharField(max_length=32, choices=Scope.choices))

    class Meta:
        constraints = [
            models.CheckConstraint(condition=models.Q(scopes__contained_by=Scope.values),
                                   name="api_key_scopes_known"),
        ]

    def __str__(self) -> str:
        return f"ap_{self.prefix}_… ({self.name})"


class TenantKey(models.Model):
    """A tenant's data-encryption key, AES-key-wrapped by the master key; one row per version."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="data_keys")
    version = models.PositiveIntegerField()
    wrapped_key = models.BinaryField()
    master_key_id = models.CharField(max_length=16)
    created_at = models.DateTimeField(auto_now_add=True)
    retired_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "version"], name="tenant_key_version_unique")
        ]


class ConsoleAccess(models.Model):
    """One look by a staff member into a tenant's runs in the console: a run list, a run's page,
    or an action on runs. Append-only (a trigger refuses UPDATE and DELETE). No foreign keys:
    the record outlives the user account and the tenant it names."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    at = models.DateTimeField(auto_now_add=True, db_index=True)
    user_id = models.IntegerField()
    username = models.CharField(max_length=150)
    tenant_schema = models.CharField(max_length=63, db_index=True)
    view = models.CharField(max_length=40)  # "run list", "run", "action: requeue", ...
    run_id = models.UUIDField(null=True, blank=True)
    path = models.CharField(max_length=500)

    class Meta:
        verbose_name = "console access"
        verbose_name_plural = "console access log"
        ordering = ["-at"]

    def __str__(self) -> str:
        return f"{self.username} {self.view} {self.tenant_schema} {self.at:%Y-%m-%d %H:%M}"
