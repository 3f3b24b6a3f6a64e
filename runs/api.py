"""REST API for runs (`/api/v1/`). The tenant was selected by the API key before any view runs.
Reads come from runs.selectors, writes from runs.services; their ServiceErrors are answered by
agentplatform.api_errors' handler."""

import re
from decimal import Decimal

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import generics, serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from agentplatform.api_contract import (
    CommaSeparatedChoices,
    NewestFirst,
    StrictStrings,
    ValidatedCursorPagination,
    error,
    filters_valid,
)
from agentplatform.api_errors import ApiError
from tenants.models import Scope

from . import services
from .models import Run
from .selectors import WAITING_FOR, checkpoint_list, run_event_list, run_list, run_or_404
from .serializers import CheckpointSerializer, EventSerializer, FieldsBoundOnce, RunSerializer

# An Idempotency-Key: printable ASCII, no surrounding blanks (they are stripped), 1-255 long.
IDEMPOTENCY_KEY = re.compile(r"[!-~]([ -~]{0,253}[!-~])?")


class RunCreateSerializer(StrictStrings, FieldsBoundOnce, serializers.Serializer):
    agent = serializers.CharField(max_length=100)
    version = serializers.IntegerField(required=False, min_value=1)
    input = serializers.DictField(required=False, default=dict)
    durability = serializers.ChoiceField(Run.Durability.choices, default=Run.Durability.SYNC)
    max_steps = serializers.IntegerField(required=False, min_value=1, max_value=10_000_000)
    max_wall_seconds = serializers.FloatField(required=False, min_value=0.001)
    max_tokens = serializers.IntegerField(required=False, min_value=1)
    # a JSON number (a decimal string's schema would admit ""), kept to the column's 6 places
    max_cost_usd = serializers.FloatField(required=False, min_value=0, max_value=999_999)

    def validate_max_cost_usd(self, value: float) -> Decimal:
        return Decimal(f"{value:.6f}")


class ForkSerializer(serializers.Serializer):
    visit = serializers.IntegerField(min_value=0)
    durability = serializers.ChoiceField(Run.Durability.choices, required=False)


class MigrateSerializer(serializers.Serializer):
    version = serializers.IntegerField(min_value=1)


class RunFilterSerializer(serializers.Serializer):
    status = CommaSeparatedChoices(Run.Status.values, required=False)
    agent = serializers.CharField(required=False, max_length=100)
    version = serializers.IntegerField(required=False, min_value=1, max_value=2_147_483_647)
    created_from = serializers.DateTimeField(required=False,
                                             help_text="Runs created at or after this time.")
    created_to = serializers.DateTimeField(required=False, help_text="Runs created before this time.")
    text = serializers.CharField(required=False, max_length=200, help_text=(
        "Found in the run's input or result (case-insensitive, in the JSON as text)."))
    waiting_for = CommaSeparatedChoices(WAITING_FOR, required=False, help_text=(
        "Waiting runs that wait for any of: approval, event, timer, child (comma-separated)."))


class InOrder(ValidatedCursorPagination):
    ordering = "id"
    page_size = 100
    max_page_size = 1000


class ByVisit(InOrder):
    ordering = "visit"


class RunListCreate(generics.ListAPIView):
    required_scopes = {"GET": Scope.RUNS_READ, "POST": Scope.RUNS_WRITE}
    serializer_class = RunSerializer
    pagination_class = NewestFirst

    filter_serializer_class = RunFilterSerializer

    @extend_schema(parameters=[RunFilterSerializer])
    def get(self, request, *args, **kwargs):
        return super().get(request, *args, **kwargs)

    def get_queryset(self):
        filters = filters_valid(self.filter_serializer_class, self.request)
        return run_list(statuses=filters.get("status"), agent=filters.get("agent"),
                        version=filters.get("version"), created_from=filters.get("created_from"),
                        created_to=filters.get("created_to"), text=filters.get("text"),
                        waiting_for=filters.get("waiting_for"))

    @extend_schema(
        request=RunCreateSerializer,
        responses={201: RunSerializer, 200: RunSerializer,
                   400: error("`invalid_input`: the input does not match the agent's input schema (the "
                   "message names each failing path, `$.invoice.amount: ...`)."),
        404: error("`unknown_agent`: no such agent (or version) is registered, or defined in "
                   "this tenant."),
        409: error("`idempotency_key_reused` with a different body; `agent_retired`: the "
                   "tenant retired this agent (DELETE /agents/{name}).")},
        parameters=[OpenApiParameter(
            "Idempotency-Key", OpenApiTypes.STR, OpenApiParameter.HEADER,
            description="The same key returns the same run (200).",
            # what a header can carry: printable ASCII, no surrounding blanks
            pattern=f"^{IDEMPOTENCY_KEY.pattern}$")])
    def post(self, request):
        body = RunCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        key = request.headers.get("Idempotency-Key", "").strip() or None
        if key and len(key) > 255:
            raise ApiError("invalid_idempotency_key", "Idempotency-Key is longer than 255 characters")
        if key and not IDEMPOTENCY_KEY.fullmatch(key):  # a NUL would be a 500 at the insert
            raise ApiError("invalid_idempotency_key",
                           "Idempotency-Key must be printable ASCII (space to ~)")
        started = services.run_start(idempotency_key=key, by=f"api:{request.user.api_key.name}",
                                     **body.validated_data)
        return Response(RunSerializer(started.run).data,
                        status=status.HTTP_201_CREATED if started.created else status.HTTP_200_OK)


class RunDetail(APIView):
    required_scopes = {"GET": Scope.RUNS_READ}

    @extend_schema(responses={200: RunSerializer})
    def get(self, request, run_id):
        return Response(RunSerializer(run_or_404(run_id)).data)


class RunCancel(APIView):
    required_scopes = {"POST": Scope.RUNS_WRITE}

    @extend_schema(request=None, responses={
        202: RunSerializer, 409: error("`run_finished`: the run already ended.")})
    def post(self, request, run_id):
        run_or_404(run_id)
        run = services.run_cancel(run_id=run_id, by=f"api:{request.user.api_key.name}")
        return Response(RunSerializer(run).data, status=status.HTTP_202_ACCEPTED)


class RunFork(APIView):
    # A fork re-opens what its source waited for: the same right as deciding its approvals.
    required_scopes = {"POST": (Scope.RUNS_WRITE, Scope.APPROVALS_DECIDE)}

    @extend_schema(request=ForkSerializer, responses={
        201: RunSerializer,
        409: error("`run_not_finished`, `checkpoint_ended`, `checkpoint_compacted`.")})
    def post(self, request, run_id):
        run_or_404(run_id)
        body = ForkSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        fork = services.run_fork(run_id=run_id, by=f"api:{request.user.api_key.name}",
                                 **body.validated_data)
        return Response(RunSerializer(fork).data, status=status.HTTP_201_CREATED)


class RunMigrate(APIView):
    required_scopes = {"POST": Scope.RUNS_WRITE}

    @extend_schema(request=MigrateSerializer, responses={
        200: RunSerializer,
        404: error("`not_found`; `unknown_agent`: the version is not registered."),
        409: error("`run_not_migratable`, `checkpoint_ended`, `step_missing`.")})
    def post(self, request, run_id):
        run_or_404(run_id)
        body = MigrateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        run = services.run_migrate(run_id=run_id, version=body.validated_data["version"],
                                   by=f"api:{request.user.api_key.name}")
        return Response(RunSerializer(run).data)


class RunEvents(generics.ListAPIView):
    required_scopes = {"GET": Scope.RUNS_READ}
    serializer_class = EventSerializer
    pagination_class = InOrder

    def get_queryset(self):
        return run_event_list(run_id=self.kwargs["run_id"])


class RunCheckpoints(generics.ListAPIView):
    required_scopes = {"GET": Scope.RUNS_READ}
    serializer_class = CheckpointSerializer
    pagination_class = ByVisit

    def get_queryset(self):
        return checkpoint_list(run_id=self.kwargs["run_id"])


class CheckpointStateSerializer(serializers.Serializer):
    visit = serializers.IntegerField()
    step = serializers.CharField()
    state = serializers.DictField(help_text="The small fields as of the checkpoint.")
    logs = serializers.DictField(child=serializers.ListField(),
                                 help_text="Each append-only log's prefix as of the checkpoint.")
    agent_version = serializers.IntegerField()
    created_at = serializers.DateTimeField()


class CheckpointState(APIView):
    required_scopes = {"GET": Scope.RUNS_READ}

    @extend_schema(responses={200: CheckpointStateSerializer})
    def get(self, request, run_id, visit):
        run_or_404(run_id)
        return Response(services.checkpoint_state(run_id=run_id, visit=visit))

