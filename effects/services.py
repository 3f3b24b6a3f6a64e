"""The effect ledger: store, check, then execute.

`effect_perform` is what `ctx.effect(...)` calls. For a (run, scope, name) it either returns the
recorded result without calling anything, or commits the effect as `pending` (fenced on the
run's lease epoch), calls the connector with a stable idempotency key, and records the outcome.
After a crash an effect found `pending` is sent again only to receivers that honour the key;
for the others the connector reconciles (`lookup`) or a person decides ("outcome unknown").
"""

import hashlib
import json
import logging
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone
from opentelemetry import trace

from integrations.connectors import Call, ConnectorError, Lookup, connector_get
from integrations.connectors.base import Found
from runs.models import Branch, Run

from .models import Effect, OutboxMessage

log = logging.getLogger(__name__)
tracer = trace.get_tracer("agentplatform.effects")


class EffectError(Exception):
    """Raised into the step: the step's retry policy decides what happens next."""


class EffectRefused(EffectError):
    """Not retryable: the step broke a rule of the ledger or the receiver said no for good."""


class NeedsPerson(Exception):
    """The run must park until a person decides; the engine turns this into an approval."""

    def __init__(self, kind: str, request: dict):
        super().__init__(request.get("title", kind))
        self.kind, self.request = kind, request


class BudgetExceeded(Exception):
    def __init__(self, message: str):
        super().__init__(message)


@dataclass(frozen=True)
class Scope:
    """Where an effect happens: which run, which step visit (or branch), under which lease."""

    run_id: UUID
    key: str  # "7" or "7/b3"
    epoch: int  # the run's lease epoch, or the branch's own when `branch` is set
    branch: int | None = None  # a fan-out branch's index: fenced on that branch's lease


def idempotency_key(*, schema: str, run_id: UUID, scope: str, name: str) -> str:
    return hashlib.sha256(f"{schema}:{run_id}:{scope}:{name}".encode()).hexdigest()[:48]


def args_digest(args: dict) -> str:
    return hashlib.sha256(json.dumps(args, sort_keys=True, default=str).encode()).hexdigest()


def effect_perform(*, scope: Scope, name: str, connector: str, args: dict,
                   budget_check=None) -> Any:
    """Run the effect once. Returns the recorded or new result; raises EffectError,
    EffectRefused, NeedsPerson or BudgetExceeded."""
    with tracer.start_as_current_span(f"effect {name}", attributes={
            "run.id": str(scope.run_id), "effect": name, "connector": connector,
            "scope": scope.key}) as span:
        result = _effect_perform(scope=scope, name=name, connector=connector, args=args,
                                 budget_check=budget_check, span=span)
        usage = result.get("usage") if isinstance(result, dict) else None
        if usage:
            span.set_attribute("model.tokens", int(usage.get("total_tokens", 0)))
            span.set_attribute("model.cost_usd", float(result.get("cost_usd", 0)))
        return result


def _effect_perform(*, scope: Scope, name: str, connector: str, args: dict, budget_check,
                    span) -> Any:
    receiver = connector_get(connector)
    schema = connection.schema_name
    digest = args_digest(args)
    effect = Effect.objects.filter(run_id=scope.run_id, scope=scope.key, name=name).first()
    if effect is None:
        if budget_check:
            budget_check()
        effect = _effect_insert(scope=scope, name=name, connector=connector, args=args,
                                digest=digest, schema=schema)
    elif effect.args_hash != digest or effect.connector != connector:
        raise EffectRefused(
            f"effect {name!r} was already recorded in this step with different arguments; "
            "give each distinct operation its own name")
    span.set_attribute("effect.recorded", effect.status == Effect.Status.DONE)
    match effect.status:
        case Effect.Status.DONE:
            return effect.result
        case Effect.Status.UNKNOWN:
            raise NeedsPerson("effect_outcome", _unknown_request(effect))
        case Effect.Status.FAILED if not effect.retryable:
            raise EffectRefused(f"effect {name!r} failed: {effect.error}")
    call = Call(tenant=schema, run_id=scope.run_id, effect=name,
                idempotency_key=effect.idempotency_key, args=args,
                credentials=_credentials(connector))
    if effect.attempts > 0 and not receiver.honours_idempotency_key and (
            effect.status == Effect.Status.PENDING
            or (effect.status == Effect.Status.FAILED and effect.retryable)):
        # An earlier attempt may have reached a receiver that ignores our key: ask it.
        found = receiver.lookup(call)
        if isinstance(found, Found):
            return _effect_done(effect, found.result, reconciled=True)
        if found is Lookup.UNKNOWN:
            Effect.objects.filter(id=effect.id).exclude(status=Effect.Status.DONE).update(
                status=Effect.Status.UNKNOWN)
            effect.status = Effect.Status.UNKNOWN
            raise NeedsPerson("effect_outcome", _unknown_request(effect))
    if budget_check and effect.attempts == 0:
        budget_check()
    # Committed before the call, and only while our lease holds: "pending with attempts > 0"
    # is what tells a later attempt that this one may have reached the receiver.
    if not _attempt_start(scope, effect.id, name):
        return Effect.objects.get(id=effect.id).result
    try:
        result = receiver.execute(call)
    except ConnectorError as exc:
        if exc.sent and not receiver.honours_idempotency_key:
            Effect.objects.filter(id=effect.id).exclude(status=Effect.Status.DONE).update(
                status=Effect.Status.UNKNOWN, error=str(exc))
            effect.status, effect.error = Effect.Status.UNKNOWN, str(exc)
            raise NeedsPerson("effect_outcome", _unknown_request(effect)) from exc
        Effect.objects.filter(id=effect.id).exclude(status=Effect.Status.DONE).update(
            status=Effect.Status.FAILED, error=str(exc), retryable=exc.retryable)
        if exc.retryable:
            raise EffectError(f"effect {name!r} via {connector}: {exc}") from exc
        raise EffectRefused(f"effect {name!r} via {connector}: {exc}") from exc
    return _effect_done(effect, result)


def _effect_insert(*, scope: Scope, name: str, connector: str, args: dict, digest: str,
                   schema: str) -> Effect:
    """Commit the pending row, only while our lease holds (a zombie worker acts on nothing):
    one statement, joined to the fence."""
    from runs.engine import LeaseLost

    key = idempotency_key(schema=schema, run_id=scope.run_id, scope=scope.key, name=name)
    fence, fence_params = _fence(scope)
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            WITH fence AS ({fence}), inserted AS (
                INSERT INTO {Effect._meta.db_table}
                       (run_id, scope, name, connector, args, args_hash, idempotency_key,
                        status, error, retryable, attempts, created_at)
                SELECT fence.run_id, %s, %s, %s, %s::jsonb, %s, %s, 'pending', '', false, 0,
                       now()
                  FROM fence
                ON CONFLICT DO NOTHING
                RETURNING id
            )
            SELECT EXISTS (SELECT 1 FROM fence)
            """,
            fence_params + [scope.key, name, connector, json.dumps(args, default=str), digest,
                            key],
        )
        held = cursor.fetchone()[0]
    if not held:
        raise LeaseLost(f"run {scope.run_id}: lease of {scope.key} (epoch {scope.epoch}) was "
                        f"taken over (effect {name!r} not started)")
    return Effect.objects.get(run_id=scope.run_id, scope=scope.key, name=name)


def _attempt_start(scope: Scope, effect_id: int, name: str) -> bool:
    """Count an attempt of the effect, in one statement joined to the fence: a worker whose
    lease moved on can never start one. False if someone recorded its outcome meanwhile."""
    from runs.engine import LeaseLost

    fence, fence_params = _fence(scope)
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            WITH fence AS ({fence}), started AS (
                UPDATE {Effect._meta.db_table} e
                   SET attempts = e.attempts + 1, status = 'pending'
                  FROM fence
                 WHERE e.id = %s AND e.run_id = fence.run_id AND e.status <> 'done'
                RETURNING e.id
            )
            SELECT EXISTS (SELECT 1 FROM fence), EXISTS (SELECT 1 FROM started)
            """,
            fence_params + [effect_id],
        )
        held, started = cursor.fetchone()
    if not held:
        raise LeaseLost(f"run {scope.run_id}: lease of {scope.key} (epoch {scope.epoch}) was "
                        f"taken over (effect {name!r} not started)")
    return started


def _fence(scope: Scope) -> tuple[str, list]:
    """The lease row the scope's effects are fenced on, locked FOR SHARE for the statement so
    a claim (epoch + 1) waits for it: the run's, or the fan-out branch's own."""
    if scope.branch is not None:
        return (f"SELECT run_id FROM {Branch._meta.db_table} WHERE id = %s AND run_id = %s "
                "AND lease_epoch = %s FOR SHARE", [scope.branch, scope.run_id, scope.epoch])
    if scope.epoch < 0:  # driven without a lease (tests and tools): no fence
        return f"SELECT id AS run_id FROM {Run._meta.db_table} WHERE id = %s", [scope.run_id]
    return (f"SELECT id AS run_id FROM {Run._meta.db_table} WHERE id = %s AND lease_epoch = %s "
            "FOR SHARE", [scope.run_id, scope.epoch])


def _effect_done(effect: Effect, result: Any, reconciled: bool = False) -> Any:
    """Record the outcome, and model usage on the run, once (facts are never fenced: a worker
    that lost its lease still reports truthfully what the world did)."""
    usage = result.get("usage") if isinstance(result, dict) else None
    with transaction.atomic():
        recorded = Effect.objects.filter(id=effect.id).exclude(status=Effect.Status.DONE).update(
            status=Effect.Status.DONE, result=result, error="", done_at=timezone.now())
        if recorded and usage:
            Run.objects.filter(id=effect.run_id).update(
                tokens_used=F("tokens_used") + int(usage.get("total_tokens", 0)),
                cost_usd=F("cost_usd") + Decimal(str(result.get("cost_usd", 0))))
        if recorded and reconciled:
            from runs.engine import event_record

            event_record(run_id=effect.run_id, kind="effect_reconciled", effect=effect.name)
    if not recorded:  # someone recorded it first: theirs is the result
        return Effect.objects.get(id=effect.id).result
    return result


def _unknown_request(effect: Effect) -> dict:
    return {
        "title": f"Did '{effect.name}' go out?",
        "body": (f"A worker stopped while sending '{effect.name}' through {effect.connector}, "
                 "which cannot tell us whether it arrived. Approve if it was delivered; reject "
                 "to send it again."),
        "effect": effect.name, "connector": effect.connector, "scope": effect.scope,
        "idempotency_key": effect.idempotency_key, "error": effect.error,
    }


def effect_outcome_decide(*, run_id: UUID, request: dict, delivered: bool, by: str) -> None:
    """A person said what happened to an effect of unknown outcome."""
    effect = Effect.objects.get(run_id=run_id, scope=request["scope"], name=request["effect"])
    if delivered:
        Effect.objects.filter(id=effect.id).update(
            status=Effect.Status.DONE, result={"confirmed_by": by}, done_at=timezone.now())
    else:  # not delivered: send again
        Effect.objects.filter(id=effect.id).update(status=Effect.Status.PENDING, attempts=0,
                                                   error="")


def _credentials(connector: str) -> dict:
    from integrations.services import credential_get

    return credential_get(connector=connector, missing_ok=True)


def budget_checker(*, run_id: UUID, requested_tokens: int):
    """A check run before a model call is made: refuse the call that would exceed a budget."""

    def check():
        run = Run.objects.only("tokens_used", "cost_usd", "max_tokens", "max_cost_usd") \
            .get(id=run_id)
        if run.max_tokens is not None and run.tokens_used + requested_tokens > run.max_tokens:
            raise BudgetExceeded(
                f"token budget: {run.tokens_used} used + up to {requested_tokens} requested "
                f"> {run.max_tokens}")
        if run.max_cost_usd is not None and run.cost_usd >= run.max_cost_usd:
            raise BudgetExceeded(f"cost budget: ${run.cost_usd} used of ${run.max_cost_usd}")

    return check


# -- the outbox ------------------------------------------------------------------------------

def outbox_enqueue(*, run_id: UUID, name: str, connector: str, args: dict) -> OutboxMessage:
    """Record a notification in the caller's transaction; delivered after commit."""
    message, _ = OutboxMessage.objects.get_or_create(
        idempotency_key=idempotency_key(schema=connection.schema_name, run_id=run_id,
                                        scope="outbox", name=name),
        defaults={"run_id": run_id, "name": name, "connector": connector, "args": args,
                  "next_attempt_at": timezone.now()},
    )
    transaction.on_commit(outbox_kick)
    return message


def outbox_kick() -> None:
    from .tasks import outbox_deliver_due

    outbox_deliver_due.delay()


def outbox_deliver(*, message_id: int) -> str:
    """Deliver one message (at least once); on failure, back off exponentially."""
    with transaction.atomic():
        message = (OutboxMessage.objects.select_for_update(skip_locked=True)
                   .filter(id=message_id, status=OutboxMessage.Status.PENDING,
                           next_attempt_at__lte=timezone.now()).first())
        if message is None:
            return "skipped"
        # Claim the attempt before calling, so a crash here costs a delay, not a duplicate loop.
        attempts = message.attempts + 1
        retry_at = timezone.now() + timedelta(
            seconds=settings.OUTBOX_BACKOFF_SECONDS * 2 ** (attempts - 1))
        OutboxMessage.objects.filter(id=message.id).update(attempts=attempts,
                                                           next_attempt_at=retry_at)
    call = Call(tenant=connection.schema_name, run_id=message.run_id, effect=message.name,
                idempotency_key=message.idempotency_key, args=message.args,
                credentials=_credentials(message.connector))
    try:
        result = connector_get(message.connector).execute(call)
    except Exception as exc:  # noqa: BLE001  (any failure: try again later, or give up)
        gave_up = attempts >= settings.OUTBOX_MAX_ATTEMPTS or (
            isinstance(exc, ConnectorError) and not exc.retryable)
        OutboxMessage.objects.filter(id=message.id).update(
            last_error=f"{type(exc).__name__}: {exc}"[:2000],
            status=OutboxMessage.Status.FAILED if gave_up else OutboxMessage.Status.PENDING)
        log.warning("outbox %s attempt %s failed: %s", message.id, attempts, exc)
        return "failed" if gave_up else "retry"
    OutboxMessage.objects.filter(id=message.id).update(
        status=OutboxMessage.Status.DELIVERED, result=result, delivered_at=timezone.now(),
        last_error="")
    return "delivered"


def outbox_due_ids(limit: int = 100) -> list[int]:
    return list(OutboxMessage.objects.filter(
        status=OutboxMessage.Status.PENDING, next_attempt_at__lte=timezone.now())
        .order_by("next_attempt_at").values_list("id", flat=True)[:limit])
