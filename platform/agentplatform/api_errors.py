"""One JSON error shape for the whole API: {"error": {"code": ..., "message": ...}}, and the one
place that says which HTTP status a service error's code means (docs/decisions/0010)."""

import math

from django.core.exceptions import RequestDataTooBig
from django.http import Http404, JsonResponse
from django.views import defaults as django_defaults
from rest_framework import exceptions, status

# The module, not its names: rest_framework.views, while it loads, imports the API-key
# authentication, which imports this module (either may be imported first).
from rest_framework import views as drf_views
from rest_framework.response import Response

from agentplatform.errors import ServiceError

# HTTP status for the codes that services raise (every ServiceError); anything else is 400.
SERVICE_ERROR_STATUS = {
    "not_found": status.HTTP_404_NOT_FOUND,
    # input limits (agentplatform/limits.py)
    "request_too_large": status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
    "json_too_deep": status.HTTP_400_BAD_REQUEST,
    # who is asking: API keys, webhook signatures and tokens
    "invalid_api_key": status.HTTP_401_UNAUTHORIZED,
    "api_key_revoked": status.HTTP_401_UNAUTHORIZED,
    "tenant_suspended": status.HTTP_403_FORBIDDEN,
    "insufficient_scope": status.HTTP_403_FORBIDDEN,
    "missing_signature": status.HTTP_401_UNAUTHORIZED,
    "invalid_timestamp": status.HTTP_401_UNAUTHORIZED,
    "stale_timestamp": status.HTTP_401_UNAUTHORIZED,
    "invalid_signature": status.HTTP_401_UNAUTHORIZED,
    "missing_token": status.HTTP_401_UNAUTHORIZED,
    "invalid_token": status.HTTP_401_UNAUTHORIZED,
    "wrong_identity": status.HTTP_403_FORBIDDEN,
    "wrong_team": status.HTTP_403_FORBIDDEN,
    "wrong_mailbox": status.HTTP_403_FORBIDDEN,
    "oidc_keys_unavailable": status.HTTP_503_SERVICE_UNAVAILABLE,
    "team_already_connected": status.HTTP_409_CONFLICT,
    "mailbox_already_connected": status.HTTP_409_CONFLICT,
    # archives: the store out of reach is 503; an archive that does not open is our fault
    "archive_store_unavailable": status.HTTP_503_SERVICE_UNAVAILABLE,
    "archive_error": status.HTTP_500_INTERNAL_SERVER_ERROR,
    "archive_corrupt": status.HTTP_500_INTERNAL_SERVER_ERROR,
    "archive_key_mismatch": status.HTTP_500_INTERNAL_SERVER_ERROR,
    "archive_raced": status.HTTP_500_INTERNAL_SERVER_ERROR,
    "data_key_missing": status.HTTP_500_INTERNAL_SERVER_ERROR,  # the platform's fault, not the caller's
    "data_key_retired": status.HTTP_500_INTERNAL_SERVER_ERROR,
    "tenant_storage_unavailable": status.HTTP_503_SERVICE_UNAVAILABLE,
    # runs, approvals, the outbox
    "not_a_decider": status.HTTP_403_FORBIDDEN,
    "reserved_event_kind": status.HTTP_403_FORBIDDEN,  # the platform's own events: not from the API
    "reserved_event_id": status.HTTP_403_FORBIDDEN,
    # a body naming an agent (or version) this deployment does not have: no such thing, like a
    # path's missing id (a schema-valid request, so not a 400: docs/decisions/0016)
    "unknown_agent": status.HTTP_404_NOT_FOUND,
    "idempotency_key_reused": status.HTTP_409_CONFLICT,
    "run_finished": status.HTTP_409_CONFLICT,
    "run_not_finished": status.HTTP_409_CONFLICT,
    "checkpoint_ended": status.HTTP_409_CONFLICT,
    "approval_closed": status.HTTP_409_CONFLICT,
    "approval_expired": status.HTTP_409_CONFLICT,
    "run_not_waiting": status.HTTP_409_CONFLICT,
    "run_not_migratable": status.HTTP_409_CONFLICT,
    "step_missing": status.HTTP_409_CONFLICT,
    "outbox_not_unknown": status.HTTP_409_CONFLICT,
    "checkpoint_compacted": status.HTTP_409_CONFLICT,
    # tenant-defined agents (invalid_definition, invalid_limits: 400 with fields)
    "definition_exists": status.HTTP_409_CONFLICT,
    "definition_conflict": status.HTTP_409_CONFLICT,
    "agent_retired": status.HTTP_409_CONFLICT,
    "platform_agent": status.HTTP_403_FORBIDDEN,  # the operator's: not the tenant's to change
    # the tenant's quotas (runs.usage.quotas): fields name the quota, limit, use and reset time
    "quota_exceeded": status.HTTP_429_TOO_MANY_REQUESTS,
}


def status_for(code: str) -> int:
    """The HTTP status an error code answers with."""
    return SERVICE_ERROR_STATUS.get(code, status.HTTP_400_BAD_REQUEST)


class ApiError(exceptions.APIException):
    """An error with a stable machine-readable code, as the API answers it."""

    def __init__(self, code: str, message: str, *, fields: dict | None = None):
        super().__init__(detail=message, code=code)
        self.status_code = status_for(code)
        self.error_code = code
        self.fields = fields  # what is wrong, by field or query parameter


def service_error(exc: ServiceError) -> ApiError:
    """The API's answer to a service error (with `fields` where the service said where, and
    `Retry-After` where it said when trying again makes sense: `retry_after`, seconds)."""
    error = ApiError(exc.code, exc.message, fields=getattr(exc, "fields", None) or None)
    error.retry_after = getattr(exc, "retry_after", None)
    return error


def _code_for(exc: Exception) -> str:
    if isinstance(exc, ApiError):
        return exc.error_code
    if isinstance(exc, Http404 | exceptions.NotFound):
        return "not_found"
    if isinstance(exc, exceptions.ValidationError):
        return "invalid_request"
    codes = getattr(exc, "get_codes", lambda: None)()
    return codes if isinstance(codes, str) else getattr(exc, "default_code", "error")


def exception_handler(exc, context):
    if isinstance(exc, ServiceError):  # a view lets its service's error through: this answers it
        exc = service_error(exc)
    if isinstance(exc, RequestDataTooBig):  # a body without Content-Length, read past the limit
        exc = ApiError("request_too_large", "The request body is too large.")
    response = drf_views.exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ValidationError):
        body = {"code": "invalid_request", "message": "The request is invalid.",
                "fields": response.data}
    else:
        detail = response.data.get("detail", "") if isinstance(response.data, dict) else ""
        body = {"code": _code_for(exc), "message": str(detail) or str(exc)}
        if getattr(exc, "fields", None):
            body["fields"] = exc.fields
    headers = {k: v for k, v in response.items() if k in ("WWW-Authenticate", "Retry-After")}
    if getattr(exc, "retry_after", None) is not None:
        headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after)))
    return Response({"error": body}, status=response.status_code, headers=headers)


def _answered_by_django(request) -> bool:
    return not request.path.startswith("/api/")


def _api_error(code: str, message: str, status_code: int) -> JsonResponse:
    return JsonResponse({"error": {"code": code, "message": message}}, status=status_code)


def bad_request(request, exception=None):
    """handler400: what Django refuses before a view (a Host not in ALLOWED_HOSTS, more query
    parameters than DATA_UPLOAD_MAX_NUMBER_FIELDS, another SuspiciousOperation) answers in the
    API's shape under /api/. The message names no detail: the exception's text may echo input."""
    if _answered_by_django(request):
        return django_defaults.bad_request(request, exception)
    return _api_error("bad_request", "The request is malformed or not allowed.", 400)


def permission_denied(request, exception=None):
    """handler403: Django's PermissionDenied (not DRF's, which the API's handler answers)."""
    if _answered_by_django(request):
        return django_defaults.permission_denied(request, exception)
    return _api_error("permission_denied", "You may not do this.", 403)


def page_not_found(request, exception=None):
    """handler404: a path under /api/ that matches no route answers in the API's shape too."""
    if _answered_by_django(request):
        return django_defaults.page_not_found(request, exception)
    return _api_error("not_found", "No such path.", 404)


def server_error(request):
    """handler500: an unexpected failure under /api/ still answers in the API's shape."""
    if _answered_by_django(request):
        return django_defaults.server_error(request)
    return _api_error("server_error", "Internal server error.", 500)
