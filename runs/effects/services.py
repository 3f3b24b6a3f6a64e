"""The effect ledger: store, check, then execute.

`effect_perform` is what `ctx.effect(...)` calls. For a (run, scope, name) it either returns the
recorded result without calling anything, or commits the effect as `pending` (fenced on the
run's lease epoch), calls the connector with a stable idempotency key, and records the outcome.
After a crash an effect found `pending` is sent again only to receivers that honour the key (or
calls that are safe to repeat, like a model's); for the others the connector reconciles
(`lookup`) or a person decides ("outcome unknown"). An attempt that failed before reaching the
receiver (`ConnectorError.sent=False`) is simply made again.

The outbox (`ctx.notify`) is delivered after the step's checkpoint commits, under a lease per
message: one deliverer claims it (`sending`, until `claimed_until`), only that claim records the
outcome, and an expired claim or a failure that may have been sent follows the same rules.
"""

import hashlib
import json
import logging
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any, NoReturn
from uuid import UUID

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F, Q
from django.utils import timezone
from opentelemetry import trace

from agentplatform.doorbell import doorbell_ring
from agentplatform.errors import ServiceError
from agentplatform.metrics import effects as effects_counted
from agentplatform.metrics import outbox_deliveries
from agentplatform.redaction import secrets_redact
from agentplatform.storable import Unstorable, json_dumped, json_storable
from agentplatform.telemetry import span_start
from integrations.connectors import Call, ConnectorError, Lookup, connector_get
from integrations.connectors.base import Found
from integrations.services import CredentialNotFound, credential_get
from runs.approvals.models import Approval
from runs.dispatch.models import TenantDue
from runs.dispatch.services import due_mark, due_sweep
from runs.engine import LeaseLost
from runs.engine.ports import (
    BudgetExceeded,
    EffectError,
    EffectRefused,
    NeedsPerson,
    Scope,
    idempotency_key,
)
from runs.events import event_record
from runs.leases import fenced_write_refused
from runs.models import Branch, Run
from runs.usage.metering import month_start
from runs.usage.quotas import QuotaExceeded, quota_check_model

from .models import Effect, OutboxMessage

log = logging.getLogger(__name__)
tracer = trace.get_tracer("agentplatform.effects")


def args_digest(args: dict) -> str:
    return hashlib.sha256(json.dumps(args, sort_keys=True, default=str).encode()).hexdigest()


def effect_perform(*, scope: Scope, name: str, connector: str, args: dict,
                   budget_check=None, credential: str = "default") -> Any:
    """Run the effect once. Returns the recorded or new result; raises EffectError,
    EffectRefused, NeedsPerson or BudgetExceeded. `credential`: the label of the tenant's
    credential for the connector (part of what is recorded: a later attempt must use it too)."""
    report = {"outcome": "done"}  # _effect_perform says "recorded" or "reconciled"
    try:
        with span_start(tracer, f"effect {name}", attributes={
                "run.id": str(scope.run_id), "effect": name, "connector": connector,
                "scope": scope.key}) as span:
            result = _effect_perform(scope=scope, name=name, connector=connector, args=args,
                                     budget_check=budget_check, span=span,
                                     credential=credential, report=report)
            usage = result.get("usage") if isinstance(result, dict) else None
            if usage:
                span.set_attribute("model.tokens", int(usage.get("total_tokens", 0)))
                span.set_attribute("model.cost_usd", float(result.get("cost_usd", 0)))
            return result
    except Exception as exc:
        report["outcome"] = next((outcome for kind, outcome in _EFFECT_OUTCOMES
                                  if isinstance(exc, kind)), "error")
        raise
    finally:  # the connector's name is the platform's (a registered class), never a tenant's
        effects_counted.add(1, {"connector": connector if _known(connector) else "other",
                                "outcome": report["outcome"]})


# the first that matches: EffectRefused is an EffectError
_EFFECT_OUTCOMES = ((EffectRefused, "refused"), (EffectError, "failed"), (NeedsPerson, "unknown"),
                    (BudgetExceeded, "budget"), (LeaseLost, "lease_lost"))


def _known(connector: str) -> bool:
    try:
        connector_get(connector)
    except Exception:
        return False
    return True


def _effect_perform(*, scope: Scope, name: str, connector: str, args: dict, budget_check,
                    span, credential: str, report: dict) -> Any:
    receiver = connector_get(connector)
    schema = connection.schema_name
    try:  # refused in words before anything is recorded, not by the database at the insert
        json_dumped([name, args], default=str)
    except Unstorable as exc:
        raise EffectRefused(f"effect {name!r}: its name or arguments cannot be stored: {exc}"
                            ) from None
    if len(name) > Effect._meta.get_field("name").max_length:
        raise EffectRefused(f"an effect's name must be at most "
                            f"{Effect._meta.get_field('name').max_length} characters")
    # The default label leaves the digest as it always was; another one is part of it.
    digest = args_digest(args if credential == "default" else {"args": args, "credential": credential})
    effect = Effect.objects.filter(run_id=scope.run_id, scope=scope.key, name=name).first()
    if effect is None:
        if budget_check:
            budget_check()
        effect = _effect_insert(scope=scope, name=name, connector=connector,
                                args=receiver.args_recorded(args), digest=digest, schema=schema)
    elif effect.args_hash != digest or effect.connector != connector:
        raise EffectRefused(
            f"effect {name!r} was already recorded in this step with different arguments; "
            "give each distinct operation its own name")
    span.set_attribute("effect.recorded", effect.status == Effect.Status.DONE)
    match effect.status:
        case Effect.Status.DONE:
            report["outcome"] = "recorded"
            return effect.result
        case Effect.Status.UNKNOWN:
            raise NeedsPerson("effect_outcome", _unknown_request(effect))
        case Effect.Status.FAILED if not effect.retryable:
            raise EffectRefused(f"effect {name!r} failed: {effect.error}")
    call = Call(tenant=schema, run_id=scope.run_id, effect=name,
                idempotency_key=effect.idempotency_key, args=args,
                credentials=_credentials(connector, credential))
    resend_is_safe = receiver.honours_idempotency_key or receiver.safe_to_repeat
    if effect.attempts > 0 and not resend_is_safe and (
            effect.status == Effect.Status.PENDING
            or (effect.status == Effect.Status.FAILED and effect.retryable and effect.maybe_sent)):
        # An earlier attempt may have reached a receiver that ignores our key: ask it. (One
        # that failed before sending, ConnectorError.sent=False, is simply made again.)
        found = receiver.lookup(call)
        if isinstance(found, Found):
            report["outcome"] = "reconciled"
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
        error = json_storable(secrets_redact(str(exc)))  # a receiver's words may hold U+0000
        if exc.sent and not resend_is_safe:
            Effect.objects.filter(id=effect.id).exclude(status=Effect.Status.DONE).update(
                status=Effect.Status.UNKNOWN, error=error, maybe_sent=True)
            effect.status, effect.error = Effect.Status.UNKNOWN, error
            raise NeedsPerson("effect_outcome", _unknown_request(effect)) from exc
        Effect.objects.filter(id=effect.id).exclude(status=Effect.Status.DONE).update(
            status=Effect.Status.FAILED, error=error, retryable=exc.retryable,
            maybe_sent=exc.sent)
        if exc.retryable:
            raise EffectError(f"effect {name!r} via {connector}: {exc}",
                              maybe_sent=exc.sent) from exc
        raise EffectRefused(f"effect {name!r} via {connector}: {exc}") from exc
    return _effect_done(effect, result)


def _effect_insert(*, scope: Scope, name: str, connector: str, args: dict, digest: str,
                   schema: str) -> Effect:
    """Commit the pending row, only while our lease holds (a zombie worker acts on nothing):
    one statement, joined to the fence. `args`: what the connector keeps of them
    (`args_recorded`); `digest` covers them whole."""

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
        raise LeaseLost(fenced_write_refused(write="effect_start", detail=(
            f"run {scope.run_id}: lease of {scope.key} (epoch {scope.epoch}) was taken over "
            f"(effect {name!r} not started)")))
    return Effect.objects.get(run_id=scope.run_id, scope=scope.key, name=name)


def _attempt_start(scope: Scope, effect_id: int, name: str) -> bool:
    """Count an attempt of the effect, in one statement joined to the fence: a worker whose
    lease moved on can never start one. False if someone recorded its outcome meanwhile."""

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
        raise LeaseLost(fenced_write_refused(write="effect_attempt", detail=(
            f"run {scope.run_id}: lease of {scope.key} (epoch {scope.epoch}) was taken over "
            f"(attempt of effect {name!r} not started)")))
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
    that lost its lease still reports truthfully what the world did). The step reads what is
    recorded (`json_storable`), so a re-run replays exactly what the first run read."""
    # A receiver's or a model's JSON may hold what jsonb refuses: a result that cannot be
    # recorded would be asked for (and a model turn paid for) again on every retry.
    result = json_storable(result)
    usage = result.get("usage") if isinstance(result, dict) else None
    with transaction.atomic():
        recorded = Effect.objects.filter(id=effect.id).exclude(status=Effect.Status.DONE).update(
            status=Effect.Status.DONE, result=result, error="", done_at=timezone.now())
        if recorded and usage:
            Run.objects.filter(id=effect.run_id).update(
                tokens_used=F("tokens_used") + int(usage.get("total_tokens", 0)),
                cost_usd=F("cost_usd") + Decimal(str(result.get("cost_usd", 0))))
        if recorded and reconciled:
            event_record(run_id=effect.run_id, kind="effect_reconciled", effect=effect.name)
    if not recorded:  # someone recorded it first: theirs is the result
        return Effect.objects.get(id=effect.id).result
    return result


def effect_outcome_unknown(*, scope: Scope, name: str) -> NoReturn:
    """Put an effect whose last attempt failed after it may have been sent to a person, as a
    crash mid-send is: the step that gives up on it parks instead of acting again under another
    name (a tenant agent's model would call the tool anew, with a new key). Approve: it was
    delivered; reject: it is sent again under its own key."""
    effect = Effect.objects.get(run_id=scope.run_id, scope=scope.key, name=name)
    if effect.status != Effect.Status.DONE:
        Effect.objects.filter(id=effect.id).exclude(status=Effect.Status.DONE).update(
            status=Effect.Status.UNKNOWN, maybe_sent=True)
        effect.status = Effect.Status.UNKNOWN
    raise NeedsPerson("effect_outcome", _unknown_request(effect, why=(
        f"'{effect.name}' through {effect.connector} failed after it may have reached the "
        f"receiver ({effect.error or 'no answer'}), every try.")))


def _unknown_request(effect: Effect, *, why: str = "") -> dict:
    why = why or (f"A worker stopped while sending '{effect.name}' through {effect.connector}, "
                  "which cannot tell us whether it arrived.")
    return {
        "title": f"Did '{effect.name}' go out?",
        "body": f"{why} Approve if it was delivered; reject to send it again.",
        "effect": effect.name, "connector": effect.connector, "scope": effect.scope,
        "idempotency_key": effect.idempotency_key, "error": effect.error,
    }


def effect_outcome_decide(*, run_id: UUID, request: dict, delivered: bool, by: str,
                          result: Any = None) -> None:
    """A person said what happened to an effect of unknown outcome; if it was delivered they
    may give the result the step reads (e.g. the receiver's message id), else it is their
    confirmation."""
    # Only while still unknown: a late answer from the first attempt may have recorded the
    # truth meanwhile, and neither a resend nor a person's result may overwrite it.
    unknown = Effect.objects.filter(run_id=run_id, scope=request["scope"],
                                    name=request["effect"], status=Effect.Status.UNKNOWN)
    if delivered:
        unknown.update(status=Effect.Status.DONE, done_at=timezone.now(),
                       result={"confirmed_by": by} if result is None else result)
    else:  # not delivered: send again
        unknown.update(status=Effect.Status.PENDING, attempts=0, error="", maybe_sent=False)


def _credentials(connector: str, label: str = "default") -> dict:
    """The secrets of the tenant's credential of that label. None under "default" means the
    connector's own defaults (the platform's SMTP relay, say); a label named on purpose (a
    definition's tool or model) that is gone (removed after the definition was saved) is a
    refusal that says so, never a call made with no credential."""
    if label == "default":
        return credential_get(connector=connector, label=label, missing_ok=True)
    try:
        return credential_get(connector=connector, label=label)
    except CredentialNotFound:
        raise EffectRefused(f"this tenant has no {connector!r} credential labelled {label!r} (was it "
                            "removed?), so the call was not made") from None


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
        quota_park_if_reached(run_id=run_id)

    return check


def quota_park_if_reached(*, run_id: UUID, now=None) -> None:
    """The tenant's monthly token or cost quota reached: park the run for the tenant's owners
    (a `quota` approval), unless an owner already let this run go past it this month."""
    use = quota_check_model(now=now)
    if use is None:
        return
    allowed = Approval.objects.filter(run_id=run_id, kind=Approval.Kind.QUOTA,
                                      status=Approval.Status.APPROVED,
                                      decided_at__gte=month_start(now or timezone.now()))
    if allowed.exists():
        return
    raise NeedsPerson(Approval.Kind.QUOTA, {
        "title": "Monthly quota reached: let this run go on?",
        "body": f"{QuotaExceeded(use).message} Approve to let this run go past it this month; "
                "reject to fail the run.",
        "reason": QuotaExceeded(use).message, "deciders": ["role:owner"], **use.as_dict()})


# -- the outbox ------------------------------------------------------------------------------

def outbox_enqueue(*, run_id: UUID, name: str, connector: str, args: dict) -> OutboxMessage:
    """Record a notification in the caller's transaction; delivered after commit."""
    with transaction.atomic():
        message, created = OutboxMessage.objects.get_or_create(
            idempotency_key=idempotency_key(schema=connection.schema_name, run_id=run_id,
                                            scope="outbox", name=name),
            defaults={"run_id": run_id, "name": name, "connector": connector, "args": args,
                      "next_attempt_at": timezone.now()},
        )
        if created:  # the sweep's backstop, should the doorbell below be lost
            due_mark(what=TenantDue.What.OUTBOX)
    outbox_kick()
    return message


def outbox_kick() -> None:
    """Ring the outbox deliverer once the caller's transaction commits. A broker that is away
    is logged, not raised: the messages are due in the due-index, and the sweep rings again."""
    doorbell_ring("effects.outbox_deliver_due", robust=True)


class OutboxError(ServiceError):
    """A refused outbox verb, with a stable code for the API."""


def outbox_deliver_next(*, owner: str) -> str | None:
    """Claim this tenant's next due message and deliver it; None when nothing is due."""
    message, maybe_sent = _outbox_claim(owner=owner)
    if message is None:
        return None
    outcome = "error"
    try:
        outcome = _outbox_attempt(message, maybe_sent=maybe_sent)
        return outcome
    finally:
        outbox_deliveries.add(1, {"connector": message.connector if _known(message.connector)
                                  else "other", "outcome": outcome})


def _outbox_claim(*, owner: str) -> tuple[OutboxMessage | None, bool]:
    """Take one due message in one compare-and-set: pending and due, or sending under a claim
    that expired (its deliverer died). A live claim is never taken. Returns the message and
    whether an earlier attempt may have reached the receiver."""
    table = OutboxMessage._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            WITH due AS (
                SELECT id, maybe_sent FROM {table}
                 WHERE (status = 'pending' AND next_attempt_at <= now())
                    OR (status = 'sending' AND claimed_until < now())
                 ORDER BY next_attempt_at LIMIT 1 FOR UPDATE SKIP LOCKED
            )
            UPDATE {table} m
               SET status = 'sending', claimed_by = %s, attempts = m.attempts + 1,
                   claimed_until = now() + make_interval(secs => %s)
              FROM due WHERE m.id = due.id
            RETURNING m.id, due.maybe_sent
            """, [owner, settings.OUTBOX_CLAIM_SECONDS])
        row = cursor.fetchone()
    if row is None:
        return None, False
    return OutboxMessage.objects.get(id=row[0]), row[1]


def _outbox_attempt(message: OutboxMessage, *, maybe_sent: bool) -> str:
    try:
        receiver = connector_get(message.connector)
        call = Call(tenant=connection.schema_name, run_id=message.run_id, effect=message.name,
                    idempotency_key=message.idempotency_key, args=message.args,
                    credentials=_credentials(message.connector))
    except Exception as exc:  # noqa: BLE001  (nothing left the process: try again later)
        log.warning("outbox %s attempt %s not started: %s", message.id, message.attempts, exc)
        gave_up = message.attempts >= settings.OUTBOX_MAX_ATTEMPTS
        return _outbox_record(message, OutboxMessage.Status.FAILED if gave_up else
                              OutboxMessage.Status.PENDING, error=f"{type(exc).__name__}: {exc}",
                              sent=maybe_sent)
    if maybe_sent and not (receiver.honours_idempotency_key or receiver.safe_to_repeat):
        # An earlier attempt may have reached a receiver that ignores our key: ask, never resend.
        try:
            found = receiver.lookup(call)
        except Exception:  # noqa: BLE001  (a lookup that fails cannot tell)
            log.exception("outbox %s: lookup failed", message.id)
            found = Lookup.UNKNOWN
        if isinstance(found, Found):
            return _outbox_record(message, OutboxMessage.Status.DELIVERED, result=found.result,
                                  event="outbox_reconciled")
        if found is Lookup.UNKNOWN:
            return _outbox_record(message, OutboxMessage.Status.UNKNOWN,
                                  error=message.last_error or "a deliverer stopped mid-call",
                                  event="outbox_unknown")
    if message.attempts > settings.OUTBOX_MAX_ATTEMPTS:  # its deliverers kept dying on it
        return _outbox_record(message, OutboxMessage.Status.FAILED,
                              error=f"gave up after {message.attempts - 1} attempts")
    if not _outbox_sending(message):
        return "lost_claim"
    try:
        result = receiver.execute(call)
    except Exception as exc:  # noqa: BLE001  (any failure: try again later, or give up)
        error = f"{type(exc).__name__}: {exc}"[:2000]
        sent = not isinstance(exc, ConnectorError) or exc.sent
        log.warning("outbox %s attempt %s failed (sent=%s): %s", message.id, message.attempts,
                    sent, exc)
        if isinstance(exc, ConnectorError) and not exc.retryable:
            return _outbox_record(message, OutboxMessage.Status.FAILED, error=error, sent=sent)
        if message.attempts >= settings.OUTBOX_MAX_ATTEMPTS:
            status = OutboxMessage.Status.FAILED
            if sent and not (receiver.honours_idempotency_key or receiver.safe_to_repeat):
                status = OutboxMessage.Status.UNKNOWN
            return _outbox_record(message, status, error=error, sent=sent,
                                  event="outbox_unknown" if status == "unknown" else None)
        return _outbox_record(message, OutboxMessage.Status.PENDING, error=error, sent=sent)
    return _outbox_record(message, OutboxMessage.Status.DELIVERED, result=result)


def _outbox_sending(message: OutboxMessage) -> bool:
    """Mark the claim "maybe sent" just before the call, while the claim is still ours: an
    expired claim that never got here (its deliverer died before calling) is resent freely."""
    marked = bool(OutboxMessage.objects.filter(
        id=message.id, status=OutboxMessage.Status.SENDING, claimed_by=message.claimed_by,
        attempts=message.attempts).update(maybe_sent=True))
    if not marked:
        fenced_write_refused(write="outbox_sending", detail=(
            f"outbox {message.id}: claim {message.attempts} of {message.claimed_by} was taken "
            "over before its call; not sent"))
    return marked


def _outbox_record(message: OutboxMessage, status: str, *, result: Any = None, error: str = "",
                   sent: bool = True, event: str | None = None) -> str:
    """Record an attempt's outcome, only while the claim is ours (owner and attempt). A late
    delivery may still settle a message left `unknown`: that is the truth a person would need."""
    claim = Q(status=OutboxMessage.Status.SENDING, claimed_by=message.claimed_by,
              attempts=message.attempts)
    if status == OutboxMessage.Status.DELIVERED:
        claim |= Q(status=OutboxMessage.Status.UNKNOWN)
    error = json_storable(secrets_redact(error))  # a receiver's words may hold U+0000
    fields = {"status": status, "claimed_by": "", "claimed_until": None, "last_error": error,
              "maybe_sent": sent}
    if status == OutboxMessage.Status.DELIVERED:
        fields.update(result=json_storable(result), delivered_at=timezone.now())
    elif status == OutboxMessage.Status.PENDING:
        fields["next_attempt_at"] = timezone.now() + timedelta(
            seconds=settings.OUTBOX_BACKOFF_SECONDS * 2 ** (message.attempts - 1))
    with transaction.atomic():
        recorded = OutboxMessage.objects.filter(claim, id=message.id).update(**fields)
        if recorded and status == OutboxMessage.Status.PENDING:  # sooner than the claim expires
            due_mark(what=TenantDue.What.OUTBOX, at=fields["next_attempt_at"])
        if recorded and event:
            event_record(run_id=message.run_id, kind=event, message=message.id,
                         name=message.name, connector=message.connector, error=error)
    if not recorded:
        fenced_write_refused(write="outbox_record", detail=(
            f"outbox {message.id}: claim {message.attempts} of {message.claimed_by} was taken "
            f"over; outcome {status} not recorded"))
        return "lost_claim"
    return "retry" if status == OutboxMessage.Status.PENDING else status


def outbox_settle(*, message_id: int, delivered: bool, by: str) -> OutboxMessage:
    """A person said whether a message of unknown outcome arrived: delivered is recorded as
    such; not delivered is sent again (the only resend a receiver that ignores keys gets)."""
    with transaction.atomic():
        message = OutboxMessage.objects.select_for_update().filter(id=message_id).first()
        if message is None:
            raise OutboxError("not_found", "No such outbox message.")
        if message.status != OutboxMessage.Status.UNKNOWN:
            raise OutboxError("outbox_not_unknown",
                              f"This message is {message.status}; only unknown ones are settled.")
        if delivered:
            message.status, message.delivered_at = OutboxMessage.Status.DELIVERED, timezone.now()
            message.result = {"confirmed_by": by}
        else:  # a fresh start: every attempt of its budget, none of them "maybe sent"
            message.status, message.next_attempt_at = OutboxMessage.Status.PENDING, timezone.now()
            message.maybe_sent, message.attempts = False, 0
        message.settled_by = by
        message.save(update_fields=["status", "delivered_at", "result", "next_attempt_at",
                                    "maybe_sent", "attempts", "settled_by"])

        event_record(run_id=message.run_id, kind="outbox_settled", message=message.id,
                     name=message.name, delivered=delivered, by=by)
        if not delivered:
            due_mark(what=TenantDue.What.OUTBOX)
            outbox_kick()
    return message


def outbox_sweep() -> int:
    """Ring the deliverer of each tenant whose outbox has a message due (a retry after backoff,
    an expired claim, a doorbell the broker lost), found in the due-index: the schemas of the
    other tenants are not looked at. Returns how many tenants were looked at."""
    return due_sweep(what=TenantDue.What.OUTBOX, visit=_outbox_sweep_visit)


def _outbox_sweep_visit() -> datetime | None:
    """In a tenant's schema: ring its deliverer if a message is due; when the next one is."""
    table = OutboxMessage._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f"""
            SELECT min(CASE WHEN status = 'pending' THEN next_attempt_at ELSE claimed_until END),
                   now()
              FROM {table} WHERE status IN ('pending', 'sending')""")
        next_due, now = cursor.fetchone()
    if next_due is not None and next_due <= now:
        outbox_kick()
    return next_due
