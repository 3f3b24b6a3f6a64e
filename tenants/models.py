"""Tenants and what lives beside them in the public schema: API keys, wrapped data keys, the
audit log of staff looking into a tenant's runs, and the tenant's people (memberships with a
role, invitations, the tenant's audit log of what its people did)."""

import uuid

from django.conf import settings
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
    # Set by an owner: the tenant's dashboard asks every member for a TOTP code at sign-in.
    require_2fa = models.BooleanField(default=False)
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
    # Defining agents: a definition decides which of the tenant's credentials runs use.
    AGENTS_WRITE = "agents:write"
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


class Role(models.TextChoices):
    """A member's role in one tenant; what each may do is tenants.roles.PERMISSIONS."""

    OWNER = "owner"  # members, API keys, settings, and everything below
    ADMIN = "admin"  # connections and credentials, and everything below but members and keys
    OPERATOR = "operator"  # start, cancel, fork, re-queue and migrate runs
    APPROVER = "approver"  # decide approvals
    VIEWER = "viewer"  # read


class Membership(models.Model):
    """A person (a Django user, email as username) in a tenant, with one role there."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                             related_name="memberships")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "tenant"], name="membership_unique"),
            models.CheckConstraint(condition=models.Q(role__in=Role.values),
                                   name="membership_role_known"),
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.tenant} as {self.role}"


class Invitation(models.Model):
    """An invitation by email to join a tenant with a role. Only the SHA-256 of its token is
    stored; the token travels in the emailed link and is good once, until expires_at."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="invitations")
    email = models.EmailField()
    role = models.CharField(max_length=16, choices=Role.choices)
    token_hash = models.CharField(max_length=64, unique=True)
    invited_by = models.CharField(max_length=254)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    accepted_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=models.Q(role__in=Role.values),
                                   name="invitation_role_known"),
        ]


class AuditEntry(models.Model):
    """One thing a tenant's person did outside a run's event log: a member invited, a key
    created, a setting changed. Append-only (a trigger refuses UPDATE and DELETE); no foreign
    keys, so it outlives the account it names. Deleted with the tenant."""

    id = models.BigAutoField(primary_key=True)
    at = models.DateTimeField(auto_now_add=True)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="audit_entries",
                               db_constraint=True)
    actor = models.CharField(max_length=260)  # "user:<email>"
    action = models.CharField(max_length=60)  # "member.invited", "api_key.created", ...
    target = models.CharField(max_length=300, blank=True, default="")
    detail = models.JSONField(default=dict, blank=True)

    class Meta:
        indexes = [models.Index(fields=["tenant", "-at"], name="audit_tenant_at")]
        ordering = ["-at", "-id"]
