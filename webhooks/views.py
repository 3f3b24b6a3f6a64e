"""Webhook endpoints (no API key: the connection in the URL names the tenant, and the request
is verified against that connection's secret or OIDC identity). Answers fast; workers do the
rest. Errors use the API's shape: {"error": {"code": ..., "message": ...}}."""

import logging

from django.http import HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from . import services
from .models import GmailConnection, SlackConnection

log = logging.getLogger(__name__)


def _error(code: str, message: str, status: int) -> JsonResponse:
    return JsonResponse({"error": {"code": code, "message": message}}, status=status)


def _rejected(kind: str, connection_id, exc: services.WebhookRejected) -> JsonResponse:
    log.warning("%s webhook %s rejected: %s", kind, connection_id, exc.code)
    return _error(exc.code, exc.message, exc.http_status)


def _not_found():
    return _error("not_found", "No such connection.", 404)


@csrf_exempt
@require_POST
def slack_events(request, connection_id):
    connection = SlackConnection.objects.select_related("tenant").filter(id=connection_id).first()
    if connection is None or not connection.tenant.is_active:
        return _not_found()
    try:
        accepted = services.slack_event_accept(connection=connection, body=request.body,
                                               headers=request.headers)
    except services.WebhookRejected as exc:
        return _rejected("slack", connection_id, exc)
    if accepted.challenge is not None:
        return JsonResponse({"challenge": accepted.challenge})
    return HttpResponse(status=200)


@csrf_exempt
@require_POST
def slack_interactivity(request, connection_id):
    connection = SlackConnection.objects.select_related("tenant").filter(id=connection_id).first()
    if connection is None or not connection.tenant.is_active:
        return _not_found()
    try:
        services.slack_interaction_accept(connection=connection, body=request.body,
                                          headers=request.headers)
    except services.WebhookRejected as exc:
        return _rejected("slack", connection_id, exc)
    return HttpResponse(status=200)


@csrf_exempt
@require_POST
def gmail_push(request, connection_id):
    connection = GmailConnection.objects.select_related("tenant").filter(id=connection_id).first()
    if connection is None or not connection.tenant.is_active:
        return _not_found()
    try:
        services.gmail_push_accept(connection=connection, body=request.body,
                                   authorization=request.headers.get("Authorization", ""))
    except services.WebhookRejected as exc:
        return _rejected("gmail", connection_id, exc)
    return HttpResponse(status=204)
