"""Effect and outbox status (`/api/v1/runs/<id>/effects`: what the run did outside), and the
outbox messages of unknown outcome that a person settles (`/api/v1/outbox`)."""

from drf_spectacular.utils import extend_schema
from rest_framework import generics, serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from agentplatform.api_contract import OldestFirst, error, filters_valid
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


class RunEffectsSerializer(serializers.Serializer):
    effects = EffectSerializer(many=True)
    outbox = OutboxSerializer(many=True)
    tokens_used = serializers.IntegerField()
    cost_usd = serializers.DecimalField(max_digits=14, decimal_places=6, coerce_to_string=True)


class OutboxFilterSerializer(serializers.Serializer):
    status = serializers.ChoiceField(OutboxMessage.Status.values, required=False)
    run = serializers.UUIDField(required=False)


class RunEffects(APIView):
    required_scopes = {"GET": Scope.RUNS_READ}

    @extend_schema(responses={200: RunEffectsSerializer})
    def get(self, request, run_id):
        run = run_or_404(run_id)
        return Response({
            "effects": EffectSerializer(effect_list(run_id=run.id), many=True).data,
            "outbox": OutboxSerializer(outbox_list(run_id=run.id).order_by("id"), many=True).data,
            "tokens_used": run.tokens_used, "cost_usd": str(run.cost_usd),
        })


class OutboxList(generics.ListAPIView):
    """Outbox messages, e.g. `?status=unknown`: the ones waiting for a person to settle."""

    required_scopes = {"GET": Scope.RUNS_READ}
    serializer_class = OutboxSerializer
    pagination_class = OldestFirst

    filter_serializer_class = OutboxFilterSerializer

    @extend_schema(parameters=[OutboxFilterSerializer])
    def get(self, request, *args, **kwargs):
        return super().get(request, *args, **kwargs)

    def get_queryset(self):
        filters = filters_valid(self.filter_serializer_class, self.request)
        return outbox_list(status=filters.get("status"), run_id=filters.get("run"))


class OutboxSettle(APIView):
    """A person says whether a message of unknown outcome arrived (`delivered`), or has it
    sent again (`delivered: false`)."""

    required_scopes = {"POST": Scope.APPROVALS_DECIDE}  # as deciding an effect_outcome approval

    @extend_schema(request=SettleSerializer, responses={
        200: OutboxSerializer, 409: error("`outbox_not_unknown`: only unknown messages are settled.")})
    def post(self, request, message_id):
        body = SettleSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        message = services.outbox_settle(
            message_id=message_id, delivered=body.validated_data["delivered"],
            by=f"api:{request.user.api_key.name}")
        return Response(OutboxSerializer(message).data, status=status.HTTP_200_OK)
