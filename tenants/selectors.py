"""Tenant reads for the console."""

from django.db.models import QuerySet

from .models import Tenant


def tenants_visible_to(*, user) -> QuerySet[Tenant]:
    """The tenants whose runs `user` (a staff member) may see in the console: a tenant marked
    superusers_only is left out for everyone but superusers."""
    tenants = Tenant.objects.order_by("schema_name")
    return tenants if user.is_superuser else tenants.filter(superusers_only=False)
