"""REST API for runs (`/api/v1/`). The tenant was selected by the API key before any view runs."""

from django.db.models import Q
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import generics, serializers, status
from rest_framework.pagination import CursorPagination
from rest_framework.response import Response
from rest_framework.views import APIView

from agentplatform.api_errors import ApiError, service_error

from . import services
from .agents import registry
from .models import Checkpoint, Run, RunEvent


class RunSerializer(serializers.ModelSerializer):
    class Meta:
        model = Run
        fields = [
            "id", "agent", "agent_version", "status", "durability", "input", "result", "error",
            "waiting_reason", "max_steps", "max_wall_seconds", "steps_taken", "active_seconds",
            "max_tokens", "max_cost_usd", "tokens_used", "cost_usd", "parent",
            "cancel_requested", "forked_from", "forked_from_visit", "created_at", "updated_at",
            "started_at", "finished_at",
        ]


class RunCreateSerializer(serializers.Serializer):
    agent = serializers.CharField(max_length=100)
    version = serializers.IntegerField(required=False, min_value=1)
    input = serializers.DictField(required=False, default=dict)
    durability = serializers.ChoiceField(Run.Durability.values, default=Run.Durability.SYNC)
    max_steps = serializers.IntegerField(required=False, min_value=1, max_value=10_000_000)
    max_wall_seconds = serializers.FloatField(required=False, min_value=0.001)
    max_tokens = serializers.IntegerField(required=False, min_value=1)
    max_cost_usd = serializers.DecimalField(required=False, max_digits=12, decimal_places=6,
                                            min_value=0)


class EventSerializer(serializers.ModelSerializer):
    class Meta:
        model = RunEvent
        fields = ["id", "kind", "visit", "data", "created_at"]


class CheckpointSerializer(serializers.ModelSerializer):
    class Meta:
        model = Checkpoint
        fields = ["visit", "step", "state", "log_offsets", "agent_version", "waiting", "created_at"]


class ForkSerializer(serializers.Serializer):
    visit = serializers.IntegerField(min_value=0)
    durability = serializers.ChoiceField(Run.Durability.values, required=False)


class MigrateSerializer(serializers.Serializer):
    version = serializers.IntegerField(min_value=1)


class NewestFirst(CursorPagination):
    ordering = "-created_at"
    page_size = 50
    page_size_query_param = "limit"
    max_page_size = 500


class InOrder(CursorPagination):
    ordering = "id"
    page_size = 100
    page_size_query_param = "limit"
    max_page_size = 1000


class ByVisit(InOrder):
    ordering = "visit"


def run_or_404(run_id) -> Run:
    run = Run.objects.filter(id=run_id).first()
    if run is None:  # another tenant's run does not exist in this schema: 404, never 403
        raise ApiError("not_found", "No such run.", status.HTTP_404_NOT_FOUND)
    return run


class RunListCreate(generics.ListAPIView):
    serializer_class = RunSerializer
    pagination_class = NewestFirst

    @extend_schema(parameters=[
        OpenApiParameter("status", str), OpenApiParameter("agent", str),
    ])
    def get(self, request, *args, **kwargs):
        return super().get(request, *args, **kwargs)

    def get_queryset(self):
        query = Q()
        if statuses := self.request.query_params.get("status"):
            wanted = statuses.split(",")
            unknown = set(wanted) - set(Run.Status.values)
            if unknown:
                raise ApiError("invalid_filter", f"unknown status {sorted(unknown)}")
            query &= Q(status__in=wanted)
        if agent := self.request.query_params.get("agent"):
            query &= Q(agent=agent)
        return Run.objects.filter(query)

    @extend_schema(request=RunCreateSerializer, responses={201: RunSerializer, 200: RunSerializer},
                   parameters=[OpenApiParameter("Idempotency-Key", str, OpenApiParameter.HEADER)])
    def post(self, request):
        body = RunCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        key = request.headers.get("Idempotency-Key", "").strip() or None
        if key and len(key) > 255:
            raise ApiError("invalid_idempotency_key", "Idempotency-Key is longer than 255 characters")
        try:
            started = services.run_start(idempotency_key=key, **body.validated_data)
        except services.RunError as exc:
            raise service_error(exc) from None
        return Response(RunSerializer(started.run).data,
                        status=status.HTTP_201_CREATED if started.created else status.HTTP_200_OK)


class RunDetail(APIView):
    @extend_schema(responses=RunSerializer)
    def get(self, request, run_id):
        return Response(RunSerializer(run_or_404(run_id)).data)


class RunCancel(APIView):
    @extend_schema(request=None, responses=RunSerializer)
    def post(self, request, run_id):
        run_or_404(run_id)
        try:
            run = services.run_cancel(run_id=run_id)
        except services.RunError as exc:
            raise service_error(exc) from None
        return Response(RunSerializer(run).data, status=status.HTTP_202_ACCEPTED)


class RunFork(APIView):
    @extend_schema(request=ForkSerializer, responses={201: RunSerializer})
    def post(self, request, run_id):
        run_or_404(run_id)
        body = ForkSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            fork = services.run_fork(run_id=run_id, **body.validated_data)
        except services.RunError as exc:
            raise service_error(exc) from None
        return Response(RunSerializer(fork).data, status=status.HTTP_201_CREATED)


class RunMigrate(APIView):
    @extend_schema(request=MigrateSerializer, responses=RunSerializer)
    def post(self, request, run_id):
        run_or_404(run_id)
        body = MigrateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            run = services.run_migrate(run_id=run_id, version=body.validated_data["version"],
                                       by=f"api:{request.user.api_key.name}")
        except services.RunError as exc:
            raise service_error(exc) from None
        return Response(RunSerializer(run).data)


class RunEvents(generics.ListAPIView):
    serializer_class = EventSerializer
    pagination_class = InOrder

    def get_queryset(self):
        return RunEvent.objects.filter(run=run_or_404(self.kwargs["run_id"]))


class RunCheckpoints(generics.ListAPIView):
    serializer_class = CheckpointSerializer
    pagination_class = ByVisit

    def get_queryset(self):
        return Checkpoint.objects.filter(run=run_or_404(self.kwargs["run_id"]))


class CheckpointState(APIView):
    def get(self, request, run_id, visit):
        run_or_404(run_id)
        try:
            return Response(services.checkpoint_state(run_id=run_id, visit=visit))
        except services.RunError as exc:
            raise service_error(exc) from None


class AgentList(APIView):
    def get(self, request):
        return Response({"results": [
            {"name": a.name, "version": a.version, "description": a.description,
             "topology_hash": a.topology_hash, "steps": a.topology["steps"]}
            for a in registry.all()
        ]})
