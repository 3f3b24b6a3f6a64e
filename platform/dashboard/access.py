"""The door into a tenant's pages: `@tenant_page(permission)` on every view under /t/<tenant>/."""

from functools import wraps
from urllib.parse import urlencode

from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.shortcuts import redirect
from django.urls import reverse
from django_otp import user_has_device
from django_tenants.utils import tenant_context

from tenants.people import actor_of, decider_identities, membership_in
from tenants.roles import PERMISSIONS, READ


class Member:
    """Who is asking, in the tenant the URL names: what the views and templates need."""

    def __init__(self, request, membership):
        self.user = request.user
        self.membership = membership
        self.tenant = membership.tenant
        self.role = membership.role
        self.actor = actor_of(request.user)  # recorded as who did it: "user:<email>"
        self.identities = decider_identities(request.user, membership.role)
        self.permissions = PERMISSIONS.get(membership.role, frozenset())

    def may(self, permission: str) -> bool:
        return permission in self.permissions

    @property
    def can(self) -> dict[str, bool]:
        """For templates: `member.can.runs_write`, `member.can.approvals_decide`, ..."""
        return {name.replace(":", "_"): True for name in self.permissions}


def tenant_page(permission: str = READ):
    """Sign-in required; the tenant in the URL must be one of the person's (404 otherwise, as
    for a tenant that does not exist); a tenant that requires two-factor sign-in, or a person
    with a confirmed TOTP device, sends an unverified session to the TOTP page; the role must
    grant `permission` (403). The view runs in the tenant's schema with `request.member` set,
    and gets the tenant's schema name as its first argument after the request."""

    def decorate(view):
        @wraps(view)
        def in_tenant(request, tenant: str, *args, **kwargs):
            if not request.user.is_authenticated:
                return redirect_to_login(request.get_full_path())
            membership = membership_in(request.user, tenant)
            if membership is None:
                raise Http404("No such tenant.")
            # A person who set up a device gives its code everywhere, not only where required:
            # otherwise a stolen password opens every tenant that does not insist.
            if not request.user.is_verified() and (membership.tenant.require_2fa
                                                   or user_has_device(request.user)):
                query = urlencode({"next": request.get_full_path(), "tenant": tenant})
                return redirect(f"{reverse('dashboard:otp')}?{query}")
            member = Member(request, membership)
            if not member.may(permission):
                raise PermissionDenied(f"Your role ({member.role}) may not do this.")
            request.member = member
            with tenant_context(member.tenant):
                response = view(request, tenant, *args, **kwargs)
                if hasattr(response, "render") and not getattr(response, "is_rendered", True):
                    response.render()  # template responses render lazily: inside the schema
            return response

        return in_tenant

    return decorate
