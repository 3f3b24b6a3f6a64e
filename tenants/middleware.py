"""Every request starts in the public schema; only API-key auth switches to a tenant. At the
end the connection goes back to what it was before the request (public, in a server)."""

from django.db import connection


class PublicSchemaMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        before = getattr(connection, "tenant", None)
        connection.set_schema_to_public()
        try:
            return self.get_response(request)
        finally:
            if before is not None and before.schema_name != connection.schema_name:
                connection.set_tenant(before)
            elif before is None:
                connection.set_schema_to_public()
