"""Effect and outbox status (`/api/v1/runs/<id>/effects`: what the run did outside), and the
outbox messages of unknown outcome that a person settles (`/api/v1/outbox`)."""

from rest_framework import generics, serializers, status
from rest_framework.pagination import CursorPagination
from rest_framework.response import Response
from rest_framework.views import APIView

from agentplatform.api_errors import uuid_filter
from runs.selectors import run_or_404
from tenants.models import Scope

from . import services
from .models import Effect, OutboxMessage
from .selectors import effect_list, outbox_list


class EffectSerializer(serializers.ModelSerializer):
    class Meta:
        model = Effect
        fields = ["scope", "name", "connector", "status", "attempts", "maybe_sent", "error",
                  "result", "idempotency_key", "created_at", "done_at"]


class OutboxSerializer(serializers.ModelSerializer):
    class Meta:
        model = OutboxMessage
        fields = ["id", "run", "name", "connector", "status", "attempts", "last_error",
                  "next_attempt_at", "claimed_until", "maybe_sent", "settled_by",
                  "idempotency_key", "created_at", "delivered_at"]


class SettleSerializer(serializers.Serializer):
    delivered = serializers.BooleanField()


class RunEffects(APIView):
    required_scopes = {"GET": Scope.RUNS_READ}

    def get(self, request, run_id):
        run = run_or_404(run_id)
        return Response({
            "effects": EffectSerializer(effect_list(run_id=run.id), many=True).data,
            "outbox": OutboxSerializer(outbox_list(run_id=run.id).order_by("id"), many=True).data,
            "tokens_used": run.tokens_used, "cost_usd": str(run.cost_usd),
        })


class Oldest(CursorPagination):
    ordering = "created_at"
    page_size = 50
    page_size_query_param = "limit"
    max_page_size = 500


class OutboxList(generics.ListAPIView):
    """Outbox messages, e.g. `?status=unknown`: the ones waiting for a person to settle."""

    required_scopes = {"GET": Scope.RUNS_READ}
    serializer_class = OutboxSerializer
    pagination_class = Oldest

    def get_queryset(self):
        run = self.request.query_params.get("run")
        return outbox_list(status=self.request.query_params.get("status"),
                           run_id=uuid_filter(run, "run") if run else None)


class OutboxSettle(APIView):
    """A person says whether a message of unknown outcome arrived (`delivered`), or has it
    sent again (`delivered: false`)."""

    required_scopes = {"POST": Scope.APPROVALS_DECIDE}  # as deciding an effect_outcome approval

    def post(self, request, message_id):
        body = SettleSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        message = services.outbox_settle(
            message_id=message_id, delivered=body.validated_data["delivered"],
            by=f"api:{request.user.api_key.name}")
        return Response(OutboxSerializer(message).data, status=status.HTTP_200_OK)
