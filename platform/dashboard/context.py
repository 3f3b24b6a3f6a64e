"""Template context for every dashboard page: the person's tenants (for the switcher)."""

from tenants.people import memberships_of


def dashboard(request):
    if request.path.startswith(("/admin/", "/api/")):
        return {}
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    # A queryset, not a list: read only by pages that draw the header, not by htmx partials
    # (a run's header polls every 2 s), and once per page (Django caches what it read).
    return {"memberships": memberships_of(user), "member": getattr(request, "member", None)}
