"""One JSON error shape for the whole API: {"error": {"code": ..., "message": ...}}."""

import uuid

from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler


class ApiError(exceptions.APIException):
    """An error a service raises with a stable machine-readable code."""

    def __init__(self, code: str, message: str, http_status: int = status.HTTP_400_BAD_REQUEST):
        super().__init__(detail=message, code=code)
        self.status_code = http_status
        self.error_code = code


# HTTP status for the codes that services raise (RunError and its kin); anything else is 400.
SERVICE_ERROR_STATUS = {
    "not_found": status.HTTP_404_NOT_FOUND,
    "not_a_decider": status.HTTP_403_FORBIDDEN,
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
}


def uuid_filter(value: str, name: str) -> uuid.UUID:
    """A query parameter that must be an id: 400 invalid_filter, never a 500."""
    try:
        return uuid.UUID(value)
    except ValueError:
        raise ApiError("invalid_filter", f"{name} must be a UUID, not {value[:64]!r}") from None


def service_error(exc) -> ApiError:
    """The API's answer to a service error carrying `code` and `message`."""
    return ApiError(exc.code, exc.message,
                    SERVICE_ERROR_STATUS.get(exc.code, status.HTTP_400_BAD_REQUEST))


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
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ValidationError):
        body = {"code": "invalid_request", "message": "The request is invalid.",
                "fields": response.data}
    else:
        detail = response.data.get("detail", "") if isinstance(response.data, dict) else ""
        body = {"code": _code_for(exc), "message": str(detail) or str(exc)}
    headers = {k: v for k, v in response.items() if k in ("WWW-Authenticate", "Retry-After")}
    return Response({"error": body}, status=response.status_code, headers=headers)
