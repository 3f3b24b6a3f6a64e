"""How a run, its events and its checkpoints look from outside: the API's shapes, and the
archive's (an archived run restores to exactly what the API showed)."""

import copy

from rest_framework import serializers

from .models import Checkpoint, Run, RunEvent


class FieldsBuiltOnce(serializers.ModelSerializer):
    """DRF builds a model serializer's fields from the model for every instance it makes (every
    response): here once per class, each instance getting copies, as DRF gives it copies of
    declared fields. Half the serializer's time in a run's POST (docs/benchmarks.md)."""

    def get_fields(self):
        cls = type(self)
        if "_fields_built" not in cls.__dict__:
            cls._fields_built = super().get_fields()
        return copy.deepcopy(cls._fields_built)


class RunSerializer(FieldsBuiltOnce):
    class Meta:
        model = Run
        fields = [
            "id", "agent", "agent_version", "status", "durability", "input", "result", "error",
            "waiting_reason", "max_steps", "max_wall_seconds", "steps_taken", "active_seconds",
            "max_tokens", "max_cost_usd", "tokens_used", "cost_usd", "parent",
            "cancel_requested", "forked_from", "forked_from_visit", "created_at", "updated_at",
            "started_at", "finished_at",
        ]


class EventSerializer(FieldsBuiltOnce):
    class Meta:
        model = RunEvent
        fields = ["id", "kind", "visit", "data", "created_at"]


class CheckpointSerializer(FieldsBuiltOnce):
    class Meta:
        model = Checkpoint
        fields = ["visit", "step", "state", "log_offsets", "agent_version", "waiting", "created_at"]
