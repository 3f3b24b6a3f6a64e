"""OpenTelemetry metrics: every instrument the platform records, and the verbs that record them.

Instruments are made from the API's meter, so they cost a no-op call until telemetry_setup
installs a MeterProvider (OTLP, Prometheus or both: agentplatform/telemetry.py).

Labels are bounded and carry no tenant data: statuses, outcomes, transition kinds and connector
names come from the platform's own code, never from a tenant (no tenant, agent, step, run or
credential label). docs/operators.md lists them.

The fleet gauges (ready list, outbox backlog) read the database: the composition root wires
the readers (`fleet_wire`), web processes turn observing them on (`fleet_observe`, from
wsgi/asgi), and a reading is cached for METRICS_GAUGE_CACHE_SECONDS, so N scrapers or an OTLP
reader cost one query per interval per process.
"""

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction
from opentelemetry import metrics
from opentelemetry.instrumentation.utils import suppress_instrumentation
from opentelemetry.metrics import CallbackOptions, Observation

log = logging.getLogger(__name__)
meter = metrics.get_meter("agentplatform")

SECONDS_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30,
                   60, 300]

runs_started = meter.create_counter(
    "agentplatform.runs.started", unit="{run}", description="Runs created (run_start).")
runs_finished = meter.create_counter(
    "agentplatform.runs.finished", unit="{run}",
    description="Runs that ended, by final status (succeeded, failed, cancelled).")
step_duration = meter.create_histogram(
    "agentplatform.step.duration", unit="s", explicit_bucket_boundaries_advisory=SECONDS_BUCKETS,
    description="One attempt of a step's body, by how it ended (the transition's kind, "
                "interrupted: parked for a person or a budget, error: raised).")
checkpoint_write_duration = meter.create_histogram(
    "agentplatform.checkpoint.write.duration", unit="s",
    explicit_bucket_boundaries_advisory=SECONDS_BUCKETS,
    description="One checkpoint write (its single statement), by durability mode.")
lease_takeovers = meter.create_counter(
    "agentplatform.lease.takeovers", unit="{claim}",
    description="Claims of a run or branch whose previous holder's lease had expired.")
fenced_writes_refused = meter.create_counter(
    "agentplatform.lease.fenced_writes_refused", unit="{write}",
    description="Writes refused because the writer's lease had moved on (a worker that was cut "
                "off or frozen, and came back), by write: checkpoint, run, effect_start, "
                "effect_attempt, branch, heartbeat, outbox_sending, outbox_record.")
effects = meter.create_counter(
    "agentplatform.effects", unit="{effect}",
    description="ctx.effect calls by connector and outcome (done, recorded: replayed from the "
                "ledger, reconciled, failed, refused, unknown, budget, lease_lost, error).")
outbox_deliveries = meter.create_counter(
    "agentplatform.outbox.deliveries", unit="{attempt}",
    description="Outbox delivery attempts by connector and outcome.")
webhook_receipts = meter.create_counter(
    "agentplatform.webhook.receipts", unit="{request}",
    description="Webhook requests by source and result (accepted, duplicate, ignored, "
                "not_found, rejected with its reason code).")


def on_commit_add(counter, attributes: dict) -> None:
    """Count once the caller's transaction commits (at once outside one): a rolled-back end is
    no end."""
    transaction.on_commit(lambda: counter.add(1, attributes))


def run_started_count() -> None:
    on_commit_add(runs_started, {})


def run_finished_count(*, status: str) -> None:
    on_commit_add(runs_finished, {"status": str(status)})


# -- the fleet gauges ----------------------------------------------------------------------------

@dataclass(frozen=True)
class ReadyBacklog:
    waiting: int  # runnable now, not yet handed to a worker
    dispatched: int  # handed to a worker (in flight)
    scheduled: int  # in line for later (deferred)
    oldest_waiting_seconds: float  # 0 when none waits


@dataclass(frozen=True)
class OutboxBacklog:
    pending: int
    sending: int
    unknown: int  # a person decides
    oldest_seconds: float  # the oldest pending or sending message's age; 0 when none


@dataclass
class _Fleet:
    ready: Callable[[], ReadyBacklog] | None = None
    outbox: Callable[[], OutboxBacklog] | None = None
    observing: bool = False


_fleet = _Fleet()
_cache: dict[str, tuple[float, object]] = {}
_cache_lock = threading.Lock()


def fleet_wire(*, ready: Callable[[], ReadyBacklog], outbox: Callable[[], OutboxBacklog]) -> None:
    """The composition root hands in the readers (they live in the apps that own the rows)."""
    _fleet.ready, _fleet.outbox = ready, outbox


def fleet_observe(on: bool = True) -> None:
    """Observe the fleet gauges in this process (web processes: each reports the same fleet
    value, so take max() across them, never sum())."""
    _fleet.observing = on


def _reading(name: str, read: Callable[[], object] | None):
    if not _fleet.observing or read is None:
        return None
    with _cache_lock:  # one reader at a time: a burst of scrapes is one query
        at, value = _cache.get(name, (0.0, None))
        if value is not None and time.monotonic() - at < settings.METRICS_GAUGE_CACHE_SECONDS:
            return value
        try:
            with suppress_instrumentation():  # a scrape's own queries are not traced
                value = read()
        except Exception:  # a gauge must never break a scrape or the export thread
            log.warning("fleet gauge %s: reading failed", name, exc_info=True)
            return None
        _cache[name] = (time.monotonic(), value)
        return value


def _ready_depth(options: CallbackOptions) -> Iterable[Observation]:
    ready = _reading("ready", _fleet.ready)
    if ready is None:
        return []
    return [Observation(ready.waiting, {"state": "waiting"}),
            Observation(ready.dispatched, {"state": "dispatched"}),
            Observation(ready.scheduled, {"state": "scheduled"})]


def _ready_age(options: CallbackOptions) -> Iterable[Observation]:
    ready = _reading("ready", _fleet.ready)
    return [] if ready is None else [Observation(ready.oldest_waiting_seconds)]


def _outbox_backlog(options: CallbackOptions) -> Iterable[Observation]:
    outbox = _reading("outbox", _fleet.outbox)
    if outbox is None:
        return []
    return [Observation(outbox.pending, {"status": "pending"}),
            Observation(outbox.sending, {"status": "sending"}),
            Observation(outbox.unknown, {"status": "unknown"})]


def _outbox_age(options: CallbackOptions) -> Iterable[Observation]:
    outbox = _reading("outbox", _fleet.outbox)
    return [] if outbox is None else [Observation(outbox.oldest_seconds)]


meter.create_observable_gauge(
    "agentplatform.ready.depth", callbacks=[_ready_depth], unit="{run}",
    description="The ready list (runs and fan-out branches) by state: waiting for a worker, "
                "dispatched to one, scheduled for later.")
meter.create_observable_gauge(
    "agentplatform.ready.oldest_age", callbacks=[_ready_age], unit="s",
    description="How long the oldest waiting entry of the ready list has waited.")
meter.create_observable_gauge(
    "agentplatform.outbox.backlog", callbacks=[_outbox_backlog], unit="{message}",
    description="Undelivered outbox messages across tenants, by status.")
meter.create_observable_gauge(
    "agentplatform.outbox.oldest_age", callbacks=[_outbox_age], unit="s",
    description="Age of the oldest pending or sending outbox message.")
