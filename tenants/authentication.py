"""DRF authentication by API key: `Authorization: Bearer ap_...`. Selects the tenant's schema."""

from django.db import connection
from rest_framework import authentication, exceptions, permissions

# The module, not its names: it imports rest_framework.views, which imports this module.
from agentplatform import api_errors

from .services import ApiKeyRejected, api_key_authenticate


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
        return TenantPrincipal(key), key

    def authenticate_header(self, request):
        return 'Bearer realm="api"'


class IsTenantRequest(permissions.BasePermission):
    def has_permission(self, request, view):
        return isinstance(request.user, TenantPrincipal)
