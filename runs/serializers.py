"""How a run, its events and its checkpoints look from outside: the API's shapes, and the
archive's (an archived run restores to exactly what the API showed)."""

from rest_framework import serializers

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


class EventSerializer(serializers.ModelSerializer):
    class Meta:
        model = RunEvent
        fields = ["id", "kind", "visit", "data", "created_at"]


class CheckpointSerializer(serializers.ModelSerializer):
    class Meta:
        model = Checkpoint
        fields = ["visit", "step", "state", "log_offsets", "agent_version", "waiting", "created_at"]
