from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularSwaggerView

from agentplatform import (
    api_contract,  # also registers the API key's security scheme
    health,
    prometheus,
)
from integrations import api as integrations_api
from integrations.webhooks import api as webhooks_api
from integrations.webhooks import views as webhooks_views
from runs import api as runs_api
from runs.approvals import api as approvals_api
from runs.definitions import api as definitions_api
from runs.effects import api as effects_api
from runs.retention import api as retention_api
from runs.usage import api as usage_api

api_v1 = [
    path("schema", api_contract.SchemaView.as_view(authentication_classes=[], permission_classes=[]),
         name="schema"),
    path("docs", SpectacularSwaggerView.as_view(url_name="schema", authentication_classes=[],
                                                permission_classes=[]), name="docs"),
    path("agents", definitions_api.AgentListCreate.as_view()),
    path("agents/<str:name>", definitions_api.AgentDetail.as_view()),
    path("agents/<str:name>/versions/<int:version>", definitions_api.AgentVersionDetail.as_view()),
    path("agent-limits", definitions_api.AgentLimitsDetail.as_view()),
    path("runs", runs_api.RunListCreate.as_view()),
    path("runs/<uuid:run_id>", runs_api.RunDetail.as_view()),
    path("runs/<uuid:run_id>/cancel", runs_api.RunCancel.as_view()),
    path("runs/<uuid:run_id>/fork", runs_api.RunFork.as_view()),
    path("runs/<uuid:run_id>/migrate", runs_api.RunMigrate.as_view()),
    path("runs/<uuid:run_id>/events", runs_api.RunEvents.as_view()),
    path("runs/<uuid:run_id>/checkpoints", runs_api.RunCheckpoints.as_view()),
    path("runs/<uuid:run_id>/checkpoints/<int:visit>/state", runs_api.CheckpointState.as_view()),
    path("runs/<uuid:run_id>/effects", effects_api.RunEffects.as_view()),
    path("outbox", effects_api.OutboxList.as_view()),
    path("outbox/<int:message_id>/settle", effects_api.OutboxSettle.as_view()),
    path("approvals", approvals_api.ApprovalList.as_view()),
    path("approvals/<uuid:approval_id>", approvals_api.ApprovalDetail.as_view()),
    path("approvals/<uuid:approval_id>/decide", approvals_api.ApprovalDecide.as_view()),
    path("events", approvals_api.EventCreate.as_view()),
    path("runs/<uuid:run_id>/archive", retention_api.RunArchive.as_view()),
    path("usage", usage_api.Usage.as_view()),
    path("credentials", integrations_api.CredentialList.as_view()),
    path("credentials/<str:connector>/<str:label>", integrations_api.CredentialDetail.as_view()),
    path("connections/slack", webhooks_api.SlackConnectionListCreate.as_view()),
    path("connections/slack/<uuid:connection_id>",
         webhooks_api.ConnectionDelete.as_view(model=webhooks_api.SlackConnection)),
    path("connections/gmail", webhooks_api.GmailConnectionListCreate.as_view()),
    path("connections/gmail/<uuid:connection_id>",
         webhooks_api.ConnectionDelete.as_view(model=webhooks_api.GmailConnection)),
]

webhooks = [
    path("slack/<uuid:connection_id>/events", webhooks_views.slack_events, name="slack-events"),
    path("slack/<uuid:connection_id>/interactivity", webhooks_views.slack_interactivity,
         name="slack-interactivity"),
    path("gmail/<uuid:connection_id>", webhooks_views.gmail_push, name="gmail-push"),
]

urlpatterns = [
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", prometheus.metrics_view, name="metrics"),  # off unless METRICS_PROMETHEUS
    path("admin/", admin.site.urls),
    path("api/v1/", include(api_v1)),
    path("webhooks/", include(webhooks)),
    path("", include("dashboard.urls")),  # the customers' dashboard, last: it owns the rest
]

# Under /api/ every error is the API's JSON shape; elsewhere (the admin) Django's own pages.
handler400 = "agentplatform.api_errors.bad_request"
handler403 = "agentplatform.api_errors.permission_denied"
handler404 = "agentplatform.api_errors.page_not_found"
handler500 = "agentplatform.api_errors.server_error"
