"""DRF authentication by API key (`Authorization: Bearer ap_...`), which selects the tenant's
schema, and the scope check: every API view declares the scopes each method needs."""

from django.db import connection
from rest_framework import authentication, exceptions, permissions

# The module, not its names: it imports rest_framework.views, which imports this module.
from agentplatform import api_errors

from .models import Scope
from .services import ApiKeyRejected, api_key_authenticate
from .throttling import api_request_count


class TenantPrincipal:
    """The authenticated caller: an API key of one tenant."""

    is_authenticated = True

    def __init__(self, api_key):
        self.api_key = api_key
        self.tenant = api_key.tenant

    def __str__(self) -> str:
        return f"{self.tenant.schema_name}:{self.api_key.prefix}"


class ApiKeyAuthentication(authentication.BaseAuthentication):
    def authenticate(self, request):
        header = request.headers.get("Authorization", "")
        scheme, _, presented = header.partition(" ")
        if not header:
            raise exceptions.NotAuthenticated("Send your API key as 'Authorization: Bearer <key>'.")
        if scheme.lower() != "bearer" or not presented.strip():
            raise api_errors.ApiError("invalid_api_key", "Use 'Authorization: Bearer <key>'.")
        try:
            key = api_key_authenticate(presented=presented.strip())
        except ApiKeyRejected as rejected:  # an APIException here, so DRF marks the request anonymous
            raise api_errors.service_error(rejected) from None
        connection.set_tenant(key.tenant)  # reset to public by PublicSchemaMiddleware
        request.tenant = key.tenant
        api_request_count(schema=key.tenant.schema_name)  # metering: runs.usage copies it daily
        return TenantPrincipal(key), key

    def authenticate_header(self, request):
        return 'Bearer realm="api"'


class IsTenantRequest(permissions.BasePermission):
    def has_permission(self, request, view):
        return isinstance(request.user, TenantPrincipal)


class HasRequiredScope(permissions.BasePermission):
    """The key holds every scope the view declares for the method, in `required_scopes`:
    `{"GET": Scope.RUNS_READ, "POST": (Scope.RUNS_WRITE, Scope.APPROVALS_DECIDE)}`. A method the
    view declares nothing for is refused (fail closed); HEAD is GET, and OPTIONS (the
    endpoint's description) needs any one scope the view declares."""

    def has_permission(self, request, view):
        if not isinstance(request.user, TenantPrincipal):
            return False  # not authenticated: IsTenantRequest answers 401
        held = set(request.user.api_key.scopes)
        declared = {method: required_scopes(view, method)
                    for method in getattr(view, "required_scopes", None) or {}}
        method = "GET" if request.method == "HEAD" else request.method
        if method == "OPTIONS":  # any one method's scopes may read the description
            if any(held.issuperset(needed) for needed in declared.values()):
                return True
            needed = tuple(scope for scope in Scope.values
                           if any(scope in scopes for scopes in declared.values()))
        else:
            needed = declared.get(method, ())
        if not needed:
            raise api_errors.ApiError(
                "insufficient_scope",
                f"{request.method} on this endpoint declares no API key scope: no key may call it.")
        if held.issuperset(needed):
            return True
        missing = [scope for scope in needed if scope not in held]
        raise api_errors.ApiError(
            "insufficient_scope",
            f"This needs the API key scope {' and '.join(needed)}; the key lacks {', '.join(missing)}.")


def required_scopes(view, method: str) -> tuple[str, ...] | None:
    """The scopes `view` declares for `method` (a non-empty tuple of str), or None."""
    declared = (getattr(view, "required_scopes", None) or {}).get(method)
    if declared is None:
        return None
    needed = tuple(str(scope) for scope in ((declared,) if isinstance(declared, str) else declared))
    if not needed or not set(needed) <= set(Scope.values):
        raise ValueError(f"{type(view).__name__}.required_scopes[{method!r}] = {declared!r}: "
                         f"declare one or more of {', '.join(Scope.values)}")
    return needed
