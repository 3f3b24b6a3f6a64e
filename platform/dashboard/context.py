"""Template context for every dashboard page: the person's tenants (for the switcher)."""

from tenants.people import memberships_of


def dashboard(request):
    if not request.path.startswith("/") or request.path.startswith(("/admin/", "/api/")):
        return {}
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    return {"memberships": list(memberships_of(user)), "member": getattr(request, "member", None)}
