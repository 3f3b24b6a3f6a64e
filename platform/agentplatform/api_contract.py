"""What the API promises beyond each view (docs/decisions/0016-api-contract.md): the error shape
in the OpenAPI schema, the statuses every authenticated operation can answer, the API key as a
security scheme, and query filters and pages that are validated (400 invalid_filter, never a
500)."""

import re
from collections.abc import Mapping

from django.core.exceptions import ValidationError
from django.core.validators import RegexValidator
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.settings import spectacular_settings
from drf_spectacular.utils import OpenApiResponse
from drf_spectacular.views import SpectacularAPIView
from rest_framework import serializers
from rest_framework.exceptions import NotFound
from rest_framework.pagination import CursorPagination
from rest_framework.renderers import JSONRenderer

from agentplatform.api_errors import ApiError

API_PREFIX = "/api/v1/"


class ErrorBodySerializer(serializers.Serializer):
    code = serializers.CharField(help_text="Stable, machine-readable: see docs/api.md#errors.")
    message = serializers.CharField(help_text="For a person.")
    fields = serializers.DictField(
        required=False, help_text="invalid_request and invalid_filter: what is wrong, by field.")


class ErrorSerializer(serializers.Serializer):
    """Every error the API answers: `{"error": {"code", "message"}}`."""

    error = ErrorBodySerializer()


def error(description: str) -> OpenApiResponse:
    """An error status of one operation, in the one error shape."""
    return OpenApiResponse(ErrorSerializer, description=description)


# What any authenticated operation can answer, whatever it does (added to each by the hook below).
COMMON_ERRORS = {
    "400": "`invalid_request` (with `fields`): a body that is not JSON, nested too deep, or "
           "fails validation; `invalid_filter`: a query parameter that is not valid.",
    "401": "`not_authenticated`, `invalid_api_key`, `api_key_revoked`.",
    "403": "`insufficient_scope`: the key lacks the scope this operation needs; "
           "`tenant_suspended`.",
    "404": "`not_found`: no such object in this tenant (another tenant's ids included), or no "
           "such path.",
    "413": "`request_too_large`: the body is over the size limit.",
    "429": "`throttled`: too many requests for this key or tenant; retry after `Retry-After` "
           "seconds. `quota_exceeded` (starting a run): a tenant quota is reached; `fields` "
           "names the quota, its limit, the use and when it resets.",
}
RETRY_AFTER = {"Retry-After": {"description": "Seconds to wait before retrying.",
                               "schema": {"type": "integer"}}}


def _error_component_ref(generator) -> str:
    """Register the error serializer (and what it nests) with the schema's components and return
    the reference to it: an operation may document no error of its own."""
    resolver = AutoSchema()
    resolver.registry, resolver.method, resolver.path, resolver.view = generator.registry, "GET", "", None
    return resolver.resolve_serializer(ErrorSerializer, "response").ref["$ref"]


def document_common_errors(result, generator, request, public):
    """Postprocessing hook: every authenticated operation under /api/v1/ documents the statuses
    that authentication, scopes, body limits and throttling can answer, in the error shape."""
    ref = _error_component_ref(generator)
    result["components"] = generator.registry.build(spectacular_settings.APPEND_COMPONENTS)
    for path, operations in result["paths"].items():
        if not path.startswith(API_PREFIX):
            continue
        for operation in operations.values():
            if not operation.get("security"):
                continue
            responses = operation.setdefault("responses", {})
            for status, description in COMMON_ERRORS.items():
                documented = responses.setdefault(status, {
                    "description": description,
                    "content": {"application/json": {"schema": {"$ref": ref}}}})
                if status == "429":
                    documented.setdefault("headers", {}).update(RETRY_AFTER)
    return result


class ApiKeyScheme(OpenApiAuthenticationExtension):
    """The tenant API key, as the schema's security scheme (`Authorization: Bearer ap_...`)."""

    target_class = "tenants.authentication.ApiKeyAuthentication"
    name = "apiKey"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "bearerFormat": "ap_<prefix>_<secret>"}


def filters_valid(serializer_class: type[serializers.Serializer], request) -> dict:
    """The query parameters of a list, validated by `serializer_class`: 400 invalid_filter naming
    each bad parameter. A plain dict, not the QueryDict: DRF reads a blank form value as "not
    given", and a blank filter is a bad one here (leave it out instead)."""
    parsed = serializer_class(data=request.query_params.dict())
    if not parsed.is_valid():
        names = ", ".join(sorted(parsed.errors))
        raise ApiError("invalid_filter", f"invalid query parameter: {names}", fields=parsed.errors)
    return parsed.validated_data


class CommaSeparatedChoices(serializers.CharField):
    """`a,b,c`, each one of `choices`; the value is the list. The pattern is in the schema too."""

    def __init__(self, choices, **kwargs):
        self.choices = list(choices)
        one = "|".join(re.escape(choice) for choice in self.choices)
        kwargs.setdefault("help_text", f"Comma-separated, any of: {', '.join(self.choices)}.")
        super().__init__(**kwargs)
        self.validators.append(RegexValidator(
            rf"^({one})(,({one}))*$", f"a comma-separated list of {', '.join(self.choices)}"))

    def run_validation(self, data=serializers.empty):
        value = super().run_validation(data)  # the pattern checks the string
        return value.split(",") if isinstance(value, str) else value


class StrictStrings:
    """For request serializers: a JSON number or boolean where the schema says string is refused,
    where DRF's CharField would quietly turn it into one."""

    def to_internal_value(self, data):
        if isinstance(data, Mapping):
            wrong = {name: ["Not a valid string."] for name, field in self.fields.items()
                     if isinstance(field, serializers.CharField) and not field.read_only
                     and data.get(name) is not None and not isinstance(data[name], str)}
            if wrong:
                raise serializers.ValidationError(wrong)
        return super().to_internal_value(data)


class ValidatedCursorPagination(CursorPagination):
    """Cursor pages whose `limit` is validated: a bad one is 400 invalid_filter, not silently the
    default page. `cursor` is opaque, so no schema can say which are valid: one this API did not
    give out is no such page, 404 (DRF's answer); so is one whose position is not a value of the
    ordering field (a date that is no date, a number that is no number), never a 500 at the
    database."""

    page_size_query_param = "limit"
    model = None

    def paginate_queryset(self, queryset, request, view=None):
        filters = getattr(view, "filter_serializer_class", None)
        known = {self.cursor_query_param, self.page_size_query_param, *(filters().fields if filters else ())}
        unknown = sorted(set(request.query_params) - known)
        if unknown:  # a misspelt filter must not answer the unfiltered list
            raise ApiError("invalid_filter", f"unknown query parameter: {', '.join(unknown)}; "
                           f"this list takes {', '.join(sorted(known))}",
                           fields={name: ["not a parameter of this list"] for name in unknown})
        self.model = queryset.model
        return super().paginate_queryset(queryset, request, view)

    def decode_cursor(self, request):
        cursor = super().decode_cursor(request)
        if cursor is None or cursor.position is None or self.model is None:
            return cursor
        field = self.model._meta.get_field(self.ordering[0].lstrip("-"))
        try:
            value = field.to_python(cursor.position)
            field.run_validators(value)
        except (ValidationError, TypeError, ValueError, OverflowError):
            raise NotFound(self.invalid_cursor_message) from None
        return cursor

    def get_page_size(self, request):
        raw = request.query_params.get(self.page_size_query_param)
        if raw is None:
            return self.page_size
        try:
            size = int(raw)
        except ValueError:
            size = 0
        if not 1 <= size <= self.max_page_size:
            raise ApiError("invalid_filter", f"limit must be an integer from 1 to {self.max_page_size}",
                           fields={"limit": [f"an integer from 1 to {self.max_page_size}"]})
        return size

    def get_schema_operation_parameters(self, view):
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            if parameter["name"] == self.page_size_query_param:
                parameter["schema"] = {"type": "integer", "minimum": 1, "maximum": self.max_page_size}
            elif parameter["name"] == self.cursor_query_param:
                parameter["description"] = ("Opaque: from a page's `next` or `previous` link. One "
                                            "this API did not give out is 404.")
        return parameters


class SchemaView(SpectacularAPIView):
    """The OpenAPI document (YAML or JSON); its errors (`?format=bogus` 404, a POST 405) in the
    API's JSON error shape, not rendered as YAML."""

    def finalize_response(self, request, response, *args, **kwargs):
        response = super().finalize_response(request, response, *args, **kwargs)
        if response.status_code >= 400:
            response.accepted_renderer = JSONRenderer()
            response.accepted_media_type = "application/json"
            response.renderer_context = self.get_renderer_context()
        return response


class NewestFirst(ValidatedCursorPagination):
    """Pages of a list, newest first (runs, approvals)."""

    ordering = "-created_at"
    page_size = 50
    max_page_size = 500


class OldestFirst(ValidatedCursorPagination):
    """Pages of a list in the order things happened (the outbox)."""

    ordering = "created_at"
    page_size = 50
    max_page_size = 500
