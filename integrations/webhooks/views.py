"""Webhook endpoints (no API key: the connection in the URL names the tenant, and the request
is verified against that connection's secret or OIDC identity). The delivery wakes its run in
the request's transaction; a worker runs it. Errors use the API's shape:
{"error": {"code": ..., "message": ...}}."""

import logging

from django.http import HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from agentplatform.api_errors import status_for
from agentplatform.metrics import webhook_receipts

from . import services
from .models import GmailConnection, SlackConnection
from .selectors import connection_receiving

log = logging.getLogger(__name__)


def _error(code: str, message: str) -> JsonResponse:
    return JsonResponse({"error": {"code": code, "message": message}}, status=status_for(code))


def _receipt(source: str, result: str, reason: str = "") -> None:
    # source and the reason codes are this module's and the services' own: a bounded set
    webhook_receipts.add(1, {"source": source, "result": result, "reason": reason})


def _rejected(kind: str, connection_id, exc: services.WebhookRejected,
              source: str) -> JsonResponse:
    log.warning("%s webhook %s rejected: %s", kind, connection_id, exc.code)
    _receipt(source, "rejected", exc.code)
    return _error(exc.code, exc.message)


def _not_found(source: str):
    _receipt(source, "not_found")
    return _error("not_found", "No such connection.")


@csrf_exempt
@require_POST
def slack_events(request, connection_id):
    connection = connection_receiving(model=SlackConnection, connection_id=connection_id)
    if connection is None:
        return _not_found("slack_events")
    try:
        accepted = services.slack_event_accept(connection=connection, body=request.body,
                                               headers=request.headers)
    except services.WebhookRejected as exc:
        return _rejected("slack", connection_id, exc, "slack_events")
    if accepted.challenge is not None:
        _receipt("slack_events", "challenge")
        return JsonResponse({"challenge": accepted.challenge})
    _receipt("slack_events", "duplicate" if accepted.duplicate else "accepted")
    return HttpResponse(status=200)


@csrf_exempt
@require_POST
def slack_interactivity(request, connection_id):
    connection = connection_receiving(model=SlackConnection, connection_id=connection_id)
    if connection is None:
        return _not_found("slack_interactivity")
    try:
        stored = services.slack_interaction_accept(connection=connection, body=request.body,
                                                   headers=request.headers)
    except services.WebhookRejected as exc:
        return _rejected("slack", connection_id, exc, "slack_interactivity")
    _receipt("slack_interactivity", "accepted" if stored else "ignored")
    return HttpResponse(status=200)


@csrf_exempt
@require_POST
def gmail_push(request, connection_id):
    connection = connection_receiving(model=GmailConnection, connection_id=connection_id)
    if connection is None:
        return _not_found("gmail")
    try:
        fresh = services.gmail_push_accept(connection=connection, body=request.body,
                                           authorization=request.headers.get("Authorization", ""))
    except services.WebhookRejected as exc:
        return _rejected("gmail", connection_id, exc, "gmail")
    _receipt("gmail", "accepted" if fresh else "duplicate")
    return HttpResponse(status=204)
