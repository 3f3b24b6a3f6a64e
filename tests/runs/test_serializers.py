"""The run, event and checkpoint serializers and a run's request body share their fields between
instances (FieldsBoundOnce): they answer, byte for byte, what DRF's own fields made anew for
each instance answer, in any time zone and from many threads at once."""

import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal

import pytest
from django.utils import timezone as django_timezone
from rest_framework import serializers
from rest_framework.renderers import JSONRenderer

from runs.api import RunCreateSerializer
from runs.models import Checkpoint, Run, RunEvent
from runs.serializers import CheckpointSerializer, EventSerializer, FieldsBoundOnce, RunSerializer
from runs.services import run_start


# The same serializers with DRF's own `fields`: a deep copy of the fields for every instance.
class PlainRunSerializer(RunSerializer):
    fields = serializers.Serializer.fields


class PlainEventSerializer(EventSerializer):
    fields = serializers.Serializer.fields


class PlainCheckpointSerializer(CheckpointSerializer):
    fields = serializers.Serializer.fields


class PlainRunCreateSerializer(RunCreateSerializer):
    fields = serializers.Serializer.fields


def rendered(serializer) -> bytes:
    return JSONRenderer().render(serializer.data)


def runs_of_every_shape() -> list[Run]:
    paris = timezone(timedelta(hours=2))
    return [
        Run(id=uuid.uuid4(), agent="research", agent_version=3, status="succeeded",
            durability="async", input={"topic": "kelp", "n": [1, 2.5, None, True], "é": "ü"},
            result={"findings": 3, "nested": {"deep": ["x", {"y": 1e-7}]}}, error="",
            waiting_reason="", max_steps=10, max_wall_seconds=0.25, steps_taken=7,
            active_seconds=1.000001, max_tokens=2**40, max_cost_usd=Decimal("12.5"),
            tokens_used=123, cost_usd=Decimal("0.000001"), parent_id=uuid.uuid4(),
            cancel_requested=True, forked_from_id=uuid.uuid4(), forked_from_visit=4,
            created_at=datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC),
            updated_at=datetime(2026, 1, 2, 5, 4, 5, tzinfo=paris),
            started_at=datetime(2026, 1, 2, 3, 4, 6, tzinfo=UTC),
            finished_at=datetime(2026, 1, 2, 3, 5, 0, 1, tzinfo=UTC)),
        Run(id=uuid.uuid4(), agent="waiter", agent_version=1, status="waiting", durability="sync",
            input={}, result=None, error="boom\n\ttraceback", waiting_reason="approval",
            max_tokens=None, max_cost_usd=None, tokens_used=0, cost_usd=Decimal("0"),
            parent_id=None, forked_from_id=None, forked_from_visit=None,
            created_at=datetime(2026, 1, 2, tzinfo=UTC), updated_at=datetime(2026, 1, 2, tzinfo=UTC),
            started_at=None, finished_at=None),
    ]


def events_and_checkpoints(run: Run) -> tuple[list[RunEvent], list[Checkpoint]]:
    at = datetime(2026, 3, 4, 5, 6, 7, 89, tzinfo=UTC)
    events = [RunEvent(id=1, run=run, kind="run_created", visit=0, data={"by": "api:ci"}, created_at=at),
              RunEvent(id=2**40, run=run, kind="note", visit=None, data={}, created_at=at)]
    checkpoints = [
        Checkpoint(run=run, visit=0, step="start", state={"a": [1, {"b": None}]}, log_offsets={},
                   agent_version=1, waiting=None, created_at=at),
        Checkpoint(run=run, visit=9, step=None, state={}, log_offsets={"findings": 3},
                   agent_version=2, waiting={"kind": "approval"}, created_at=at),
    ]
    return events, checkpoints


@pytest.mark.parametrize("zone", ["UTC", "Europe/Paris"])
def test_responses_are_byte_for_byte_drfs_own(zone):
    with django_timezone.override(zone):
        for run in runs_of_every_shape():
            assert rendered(RunSerializer(run)) == rendered(PlainRunSerializer(run))
            events, checkpoints = events_and_checkpoints(run)
            assert rendered(EventSerializer(events, many=True)) == rendered(
                PlainEventSerializer(events, many=True))
            assert rendered(CheckpointSerializer(checkpoints, many=True, context={"x": 1})) == \
                rendered(PlainCheckpointSerializer(checkpoints, many=True, context={"x": 1}))
        runs = runs_of_every_shape()
        assert rendered(RunSerializer(runs, many=True)) == rendered(PlainRunSerializer(runs, many=True))


def test_a_started_run_as_read_back_is_answered_as_drf_would(in_acme):
    started = run_start(agent="research", input={"topic": "kelp"}, max_cost_usd=Decimal("1.5"),
                        enqueue=False).run
    for run in (started, Run.objects.get(id=started.id)):
        assert rendered(RunSerializer(run)) == rendered(PlainRunSerializer(run))


BODIES = [
    {"agent": "research"},
    {"agent": "research", "version": 2, "input": {"a": [1, None]}, "durability": "exit",
     "max_steps": 5, "max_wall_seconds": 0.5, "max_tokens": 9, "max_cost_usd": 1.2345678},
    {},
    {"agent": 7},
    {"agent": "", "durability": "sometimes"},
    {"agent": "x" * 101, "version": 0, "max_steps": 10_000_001, "max_cost_usd": -1},
    {"agent": "research", "input": "not an object", "max_wall_seconds": 0},
    {"agent": "research", "input": None, "version": "two", "max_tokens": 1.5},
    [],
    "text",
]


@pytest.mark.parametrize("body", BODIES)
def test_request_bodies_are_validated_as_drf_would(body):
    ours, plain = RunCreateSerializer(data=body), PlainRunCreateSerializer(data=body)
    assert ours.is_valid() == plain.is_valid()
    assert ours.errors == plain.errors
    assert [(k, v, type(v)) for k, v in ours.validated_data.items()] == [
        (k, v, type(v)) for k, v in plain.validated_data.items()]


def test_shared_fields_answer_many_threads_at_once():
    runs = [run for _ in range(20) for run in runs_of_every_shape()]

    def checked(serializer) -> tuple[bool, dict]:
        return serializer.is_valid(), serializer.errors

    expected = [(rendered(PlainRunSerializer(run)),
                 checked(PlainRunCreateSerializer(data=BODIES[i % len(BODIES)])))
                for i, run in enumerate(runs)]

    def serialize(i: int):
        return (rendered(RunSerializer(runs[i])),
                checked(RunCreateSerializer(data=BODIES[i % len(BODIES)])))

    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(serialize, range(len(runs)))) == expected


def test_a_field_that_could_not_be_shared_is_refused_and_so_is_partial():
    class WithMethod(FieldsBoundOnce, serializers.Serializer):
        name = serializers.SerializerMethodField()

    with pytest.raises(TypeError, match="SerializerMethodField"):
        dict(WithMethod({}).data)
    with pytest.raises(TypeError, match="partial"):
        RunCreateSerializer(data={}, partial=True)
