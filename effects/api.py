"""Per-run effect and outbox status (`/api/v1/runs/<id>/effects`): what the run did outside."""

from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from runs.api import run_or_404

from .models import Effect, OutboxMessage


class EffectSerializer(serializers.ModelSerializer):
    class Meta:
        model = Effect
        fields = ["scope", "name", "connector", "status", "attempts", "error", "result",
                  "idempotency_key", "created_at", "done_at"]


class OutboxSerializer(serializers.ModelSerializer):
    class Meta:
        model = OutboxMessage
        fields = ["name", "connector", "status", "attempts", "last_error", "next_attempt_at",
                  "idempotency_key", "created_at", "delivered_at"]


class RunEffects(APIView):
    def get(self, request, run_id):
        run = run_or_404(run_id)
        return Response({
            "effects": EffectSerializer(run.effects.order_by("id"), many=True).data,
            "outbox": OutboxSerializer(run.outbox.order_by("id"), many=True).data,
            "tokens_used": run.tokens_used, "cost_usd": str(run.cost_usd),
        })
