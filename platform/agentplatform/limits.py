"""The API's body size limit, answered in its error shape: a body larger than
DATA_UPLOAD_MAX_MEMORY_SIZE is 413 `request_too_large`, before it is read. (JSON depth:
agentplatform/parsers.py.)"""

from django.conf import settings
from django.http import JsonResponse

from agentplatform.api_errors import status_for

LIMITED_PATHS = ("/api/", "/webhooks/")


def request_too_large_message() -> str:
    return f"The request body is larger than {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes."


class RequestSizeLimitMiddleware:
    """Refuses an API or webhook request whose Content-Length is over the limit, unread. Bodies
    without one (chunked) are bounded where they are read: Django's own check on request.body
    and request.POST raises RequestDataTooBig, which the API's handler answers the same way."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if request.path.startswith(LIMITED_PATHS):
            try:
                length = int(request.META.get("CONTENT_LENGTH") or 0)
            except ValueError:
                length = 0  # Django reads such a body as empty
            limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
            if limit is not None and length > limit:
                return JsonResponse(
                    {"error": {"code": "request_too_large", "message": request_too_large_message()}},
                    status=status_for("request_too_large"))
        return self.get_response(request)
