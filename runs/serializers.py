"""How a run, its events and its checkpoints look from outside: the API's shapes, and the
archive's (an archived run restores to exactly what the API showed)."""

from rest_framework import serializers
from rest_framework.fields import _UnvalidatedField
from rest_framework.utils.serializer_helpers import BindingDict

from .models import Checkpoint, Run, RunEvent

# Field classes whose output and validation read the field's own settings, the value and the
# current time zone, never the context or the serializer the field is bound to, and that write
# nothing to the field once bound: their instances may be shared by every serializer instance,
# in every thread at once (FieldsBoundOnce).
SHAREABLE_FIELDS = frozenset({
    serializers.BigIntegerField, serializers.BooleanField, serializers.CharField,
    serializers.ChoiceField, serializers.DateTimeField, serializers.DecimalField,
    serializers.DictField, serializers.FloatField, serializers.IntegerField,
    serializers.JSONField, serializers.UUIDField, serializers.PrimaryKeyRelatedField,
    _UnvalidatedField,  # a DictField's child when it names none: any value
})


class FieldsBoundOnce:
    """A serializer whose fields DRF builds and binds once per class, and every instance reads
    that one set, where DRF deep-copies them for each instance: each response and each request
    body (in a run's POST, 0.4 ms of CPU of the 0.5 ms its two serializers took).

    The set is bound to an instance of the class with no context that is not partial, and
    gunicorn's threads read it at once; so its fields must be of SHAREABLE_FIELDS (checked when
    it is built), their validators are made before it is shared (DRF makes them at first use),
    and a partial instance is refused (validation reads `partial` from the fields' serializer).
    """

    def __init__(self, *args, **kwargs):
        if kwargs.get("partial"):
            raise TypeError(f"{type(self).__name__} shares its fields: it cannot be partial")
        super().__init__(*args, **kwargs)

    @property
    def fields(self) -> BindingDict:
        cls = type(self)
        if "_fields_bound" not in cls.__dict__:  # a race builds two, equal: either is used
            cls._fields_bound = _fields_bind(cls)
        return cls._fields_bound


def _fields_bind(cls: type[serializers.Serializer]) -> BindingDict:
    template = cls()
    bound = BindingDict(template)
    for name, field in template.get_fields().items():
        for part in (field, getattr(field, "child", None)):
            if part is None:
                continue
            if type(part) not in SHAREABLE_FIELDS:
                raise TypeError(f"{cls.__name__}.{name} is a {type(part).__name__}, which "
                                "FieldsBoundOnce cannot share: see SHAREABLE_FIELDS")
            part.validators = part.validators  # made now, not by a request's first use
        bound[name] = field
    return bound


class RunSerializer(FieldsBoundOnce, serializers.ModelSerializer):
    """A run: its agent and version, where it is (status, and why it waits), its limits and
    what it has used, its result or error, and the run it was forked from."""

    class Meta:
        model = Run
        fields = [
            "id", "agent", "agent_version", "status", "durability", "input", "result", "error",
            "waiting_reason", "max_steps", "max_wall_seconds", "steps_taken", "active_seconds",
            "max_tokens", "max_cost_usd", "tokens_used", "cost_usd", "parent",
            "cancel_requested", "forked_from", "forked_from_visit", "created_at", "updated_at",
            "started_at", "finished_at",
        ]


class EventSerializer(FieldsBoundOnce, serializers.ModelSerializer):
    """One entry of a run's timeline (`kind`: run_started, step_error, run_parked, ...), at the
    visit it happened, with what the kind records in `data`."""

    class Meta:
        model = RunEvent
        fields = ["id", "kind", "visit", "data", "created_at"]


class CheckpointSerializer(FieldsBoundOnce, serializers.ModelSerializer):
    """Where a run was after a step: the step it goes to next, its small state, how long each
    append-only log was, and what it waited on, if it parked there."""

    class Meta:
        model = Checkpoint
        fields = ["visit", "step", "state", "log_offsets", "agent_version", "waiting", "created_at"]
