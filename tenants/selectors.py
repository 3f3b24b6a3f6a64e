"""Tenant reads: tenants for the console, a tenant's API keys for the dashboard."""

from django.db.models import QuerySet

from .models import ApiKey, Tenant


def tenants_visible_to(*, user) -> QuerySet[Tenant]:
    """The tenants whose runs `user` (a staff member) may see in the console: a tenant marked
    superusers_only is left out for everyone but superusers."""
    tenants = Tenant.objects.order_by("schema_name")
    return tenants if user.is_superuser else tenants.filter(superusers_only=False)


def api_key_list(*, tenant: Tenant) -> QuerySet[ApiKey]:
    """The tenant's API keys, revoked ones too (they stay listed, marked), newest first."""
    return ApiKey.objects.filter(tenant=tenant).order_by("-created_at", "-id")


def api_key_of(*, tenant: Tenant, key_id: int) -> ApiKey | None:
    """One of the tenant's keys by id; None for another tenant's key, as for one that is not."""
    return ApiKey.objects.filter(tenant=tenant, pk=key_id).first()
