"""REST API for a tenant's Slack and Gmail connections (`/api/v1/connections/...`), by API key.
The signing secret is write-only: it is sealed on the way in and never returned."""

from django.urls import reverse
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from agentplatform.api_contract import StrictStrings, error
from tenants.models import Scope

from . import services
from .models import GmailConnection, SlackConnection
from .selectors import gmail_connection_list, slack_connection_list


class SlackConnectionSerializer(StrictStrings, serializers.ModelSerializer):
    signing_secret = serializers.CharField(write_only=True, max_length=200,
                                           style={"input_type": "password"})
    events_url = serializers.SerializerMethodField()
    interactivity_url = serializers.SerializerMethodField()

    class Meta:
        model = SlackConnection
        fields = ["id", "team_id", "approvals_channel", "signing_secret", "events_url",
                  "interactivity_url", "created_at"]
        extra_kwargs = {"team_id": {"validators": []}}  # uniqueness: the service answers 409

    def _url(self, name, connection) -> str:
        path = reverse(name, args=[connection.id])
        request = self.context.get("request")
        return request.build_absolute_uri(path) if request else path

    def get_events_url(self, connection) -> str:
        return self._url("slack-events", connection)

    def get_interactivity_url(self, connection) -> str:
        return self._url("slack-interactivity", connection)


class GmailConnectionSerializer(StrictStrings, serializers.ModelSerializer):
    push_url = serializers.SerializerMethodField()

    class Meta:
        model = GmailConnection
        fields = ["id", "email", "audience", "service_account_email", "push_url", "created_at"]
        extra_kwargs = {"email": {"validators": []}}

    def get_push_url(self, connection) -> str:
        path = reverse("gmail-push", args=[connection.id])
        request = self.context.get("request")
        return request.build_absolute_uri(path) if request else path


def _create(request, serializer_class, create):
    body = serializer_class(data=request.data, context={"request": request})
    body.is_valid(raise_exception=True)
    connection = create(tenant=request.tenant, **body.validated_data)
    return Response(serializer_class(connection, context={"request": request}).data,
                    status=status.HTTP_201_CREATED)


class SlackConnectionListCreate(APIView):
    required_scopes = {"GET": Scope.ADMIN, "POST": Scope.ADMIN}

    @extend_schema(responses={200: SlackConnectionSerializer(many=True)})
    def get(self, request):
        rows = slack_connection_list(tenant=request.tenant)
        return Response(SlackConnectionSerializer(rows, many=True,
                                                  context={"request": request}).data)

    @extend_schema(request=SlackConnectionSerializer, responses={
        201: SlackConnectionSerializer,
        409: error("`team_already_connected`: the Slack team belongs to a connection already.")})
    def post(self, request):
        return _create(request, SlackConnectionSerializer, services.slack_connection_create)


class GmailConnectionListCreate(APIView):
    required_scopes = {"GET": Scope.ADMIN, "POST": Scope.ADMIN}

    @extend_schema(responses={200: GmailConnectionSerializer(many=True)})
    def get(self, request):
        rows = gmail_connection_list(tenant=request.tenant)
        return Response(GmailConnectionSerializer(rows, many=True,
                                                  context={"request": request}).data)

    @extend_schema(request=GmailConnectionSerializer, responses={
        201: GmailConnectionSerializer,
        409: error("`mailbox_already_connected`: the mailbox belongs to a connection already.")})
    def post(self, request):
        return _create(request, GmailConnectionSerializer, services.gmail_connection_create)


class ConnectionDelete(APIView):
    required_scopes = {"DELETE": Scope.ADMIN}
    model = None

    @extend_schema(request=None, responses={204: None})
    def delete(self, request, connection_id):
        services.connection_delete(model=self.model, tenant=request.tenant,
                                   connection_id=connection_id)
        return Response(status=status.HTTP_204_NO_CONTENT)
