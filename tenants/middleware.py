"""Every request starts and ends in the public schema; only API-key auth switches to a tenant."""

from django.db import connection


class PublicSchemaMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        connection.set_schema_to_public()
        try:
            return self.get_response(request)
        finally:
            connection.set_schema_to_public()
