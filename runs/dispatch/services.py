"""Fair dispatch: which runnable runs go to workers next, and the watchdog that notices lost
messages and dead workers. PostgreSQL holds the truth; a Celery message is only a doorbell.

Order: each tenant's ready runs are numbered oldest first, counting the ones it already has in
flight; the smallest numbers go first. A tenant with 500 queued runs and one with 1 therefore
alternate, and no tenant has more than RUN_TENANT_MAX_IN_FLIGHT runs in flight at once.
"""

import logging
from collections import defaultdict
from collections.abc import Callable
from datetime import datetime, timedelta
from functools import partial
from uuid import UUID

import psycopg
from django.conf import settings
from django.db import OperationalError, connection, transaction
from django.db.models import Value
from django.db.models.functions import Greatest, Now
from django.utils import timezone
from django_tenants.utils import schema_context

from agentplatform.doorbell import Ring, doorbell_away, doorbell_ring_all, ring_of
from agentplatform.telemetry import trace_parent
from tenants.models import Tenant

from .models import ReadyRun, TenantDue, Wakeup
from .ports import tick_handlers

log = logging.getLogger(__name__)
READY = f"public.{ReadyRun._meta.db_table}"
DUE = f"public.{TenantDue._meta.db_table}"
DISPATCH_LOCK = 0x6170_6469_7370  # any constant: one dispatcher at a time


def ready_mark(*, run_id: UUID, branch: int = -1) -> None:
    """The run (or branch) is runnable: put it in line, at the back of its tenant's line.

    Call inside the transaction that makes it runnable."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            INSERT INTO {READY} (tenant_id, schema_name, run_id, branch, ready_at, dispatched_at,
                                 traceparent)
            SELECT t.id, t.schema_name, %s, %s, now(), NULL, %s
              FROM public.tenants_tenant t WHERE t.schema_name = %s
            ON CONFLICT (run_id, branch) DO UPDATE SET ready_at = now(), dispatched_at = NULL,
                                                      deferred_since = NULL,
                                                      traceparent = EXCLUDED.traceparent
            """,
            [run_id, branch, trace_parent(), connection.schema_name],
        )


def ready_defer(*, run_id: UUID, branch: int = -1, delay_seconds: float) -> float:
    """A worker handed the run (or branch) back: in line again in `delay_seconds`, for another
    worker. Returns for how many seconds it has been handed back without running."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            INSERT INTO {READY} AS r (tenant_id, schema_name, run_id, branch, ready_at,
                                      dispatched_at, deferred_since, traceparent)
            SELECT t.id, t.schema_name, %s, %s, now() + %s, NULL, now(), ''
              FROM public.tenants_tenant t WHERE t.schema_name = %s
            ON CONFLICT (run_id, branch) DO UPDATE
               SET ready_at = EXCLUDED.ready_at, dispatched_at = NULL,
                   deferred_since = coalesce(r.deferred_since, now())
         RETURNING extract(epoch FROM now() - deferred_since)
            """,
            [run_id, branch, timedelta(seconds=delay_seconds), connection.schema_name],
        )
        return float(cursor.fetchone()[0])


def ready_requeue(*, run_id: UUID, branch: int = -1) -> None:
    """Back in line, if it is in line at all (runs driven in-process are not)."""
    ReadyRun.objects.filter(run_id=run_id, branch=branch).update(
        ready_at=timezone.now(), dispatched_at=None, deferred_since=None
    )


def ready_clear(*, run_id: UUID, branch: int | None = None) -> None:
    """Out of line (it ended, parked or went elsewhere): one DELETE, not Django's collector
    (which SELECTs the rows first)."""
    with connection.cursor() as cursor:
        if branch is None:
            cursor.execute(f"DELETE FROM {READY} WHERE run_id = %s", [run_id])
        else:
            cursor.execute(f"DELETE FROM {READY} WHERE run_id = %s AND branch = %s",
                           [run_id, branch])


def dispatch_ready(*, budget: int | None = None, wait: bool = False, robust: bool = False,
                   keep: list[Ring] | None = None) -> int | None:
    """Pick the next ready runs in fair order and ring their doorbells (on commit). Returns
    how many, or None if another dispatcher holds the lock.

    `keep`: the caller runs one picked run itself (a worker whose slot this pick refills):
    the first picked run in fair order (not a branch) is not rung but appended to `keep` on
    commit, as the ring it would have been; the caller runs it or rings it
    (`doorbell_ring_all`). Its ready row is dispatched like the others, so a caller that dies
    before running it leaves it to the watchdog, as a lost message would.

    Inside a caller's transaction it sees what that transaction put in line, and holds the
    dispatcher's lock until it commits. `wait`: wait up to DISPATCH_LOCK_WAIT_SECONDS for
    another dispatcher rather than leave the pick to it (then to the next tick); only in a
    transaction that holds nothing another may wait for (`dispatch_after_commit`; run_start,
    whose new rows nobody sees until it commits). `robust`: a send that fails
    puts its row back in line for the next tick, not the watchdog, and raises nothing; and
    while the broker is away from this process (`doorbell_away`), nothing is picked unless
    for `keep` (0 is returned): the tick's process picks them, rather than this one picking,
    committing and putting every row back."""
    if robust and keep is None and doorbell_away():
        return 0
    budget = settings.DISPATCH_MAX_IN_FLIGHT if budget is None else budget
    try:
        return _dispatch(budget=budget, wait=wait, robust=robust, keep=keep)
    except OperationalError as exc:
        if wait and isinstance(exc.__cause__, psycopg.errors.LockNotAvailable):
            return None  # a long pick holds it: the next tick hands these out
        raise


def dispatch_after_commit() -> None:
    """Run the dispatcher once the caller's transaction commits (now, outside one), however
    many runs it put in line: once per transaction, waiting for another dispatcher's lock in
    a transaction of its own, so a caller never holds the dispatcher's lock while it goes on
    (an event that wakes a thousand runs) and never waits for it while holding its runs."""
    # One is enough if it was registered where it outlives this point: at this savepoint level
    # or an enclosing one (one registered in a savepoint that may yet roll back is not).
    here = set(connection.savepoint_ids)
    if not any(func is _dispatch_waiting and sids <= here
               for sids, func, _ in connection.run_on_commit):
        transaction.on_commit(_dispatch_waiting, robust=True)


def _dispatch_waiting() -> None:
    dispatch_ready(wait=True, robust=True)


def _dispatch(*, budget: int, wait: bool, robust: bool, keep: list[Ring] | None) -> int | None:
    with transaction.atomic(), connection.cursor() as cursor:
        if wait:  # the lock wait bounded, then the caller's lock_timeout again: a caller's
            # transaction that goes on to commit (run_start, a run's end) keeps its own. One
            # statement, each step after the one it reads from; a wait that times out rolls
            # back this savepoint, and the setting with it.
            cursor.execute(
                "WITH before AS MATERIALIZED (SELECT current_setting('lock_timeout') AS value),"
                " bounded AS MATERIALIZED (SELECT set_config('lock_timeout', %s, true) FROM before),"
                " held AS MATERIALIZED (SELECT pg_advisory_xact_lock(%s) FROM bounded)"
                " SELECT set_config('lock_timeout', before.value, true) FROM before, held",
                [f"{max(1, int(settings.DISPATCH_LOCK_WAIT_SECONDS * 1000))}ms", DISPATCH_LOCK])
        else:
            cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [DISPATCH_LOCK])
            if not cursor.fetchone()[0]:
                return None  # another dispatcher is at it
        cursor.execute(
            f"""
            WITH inflight AS (
                SELECT tenant_id, count(*) AS n FROM {READY}
                 WHERE dispatched_at IS NOT NULL GROUP BY tenant_id
            ), ranked AS (
                SELECT r.id, r.ready_at, coalesce(t.max_in_flight, %s) AS cap,
                       row_number() OVER (PARTITION BY r.tenant_id ORDER BY r.ready_at, r.id)
                         + coalesce(i.n, 0) AS place
                  FROM {READY} r
                  JOIN public.tenants_tenant t ON t.id = r.tenant_id AND t.status = 'active'
                  LEFT JOIN inflight i ON i.tenant_id = r.tenant_id
                 WHERE r.dispatched_at IS NULL AND r.ready_at <= now()
            ), picked AS (
                SELECT id, place, ready_at FROM ranked WHERE place <= cap ORDER BY place, ready_at
                 LIMIT greatest(%s - (SELECT count(*) FROM {READY}
                                       WHERE dispatched_at IS NOT NULL), 0)
            ), dispatched AS (
                UPDATE {READY} r SET dispatched_at = clock_timestamp() FROM picked
                 WHERE r.id = picked.id
             RETURNING r.schema_name, r.run_id, r.branch, r.traceparent, r.id, r.dispatched_at,
                       picked.place, picked.ready_at
            )
            SELECT schema_name, run_id, branch, traceparent, id, dispatched_at FROM dispatched
             ORDER BY place, ready_at
            """,
            [settings.RUN_TENANT_MAX_IN_FLIGHT, budget],
        )
        picked = cursor.fetchall()
        # each rings once the pick commits, in the trace of whoever made it runnable
        rings = [
            ring_of("runs.advance" if branch < 0 else "runs.advance_branch",
                    [str(run_id)] if branch < 0 else [str(run_id), branch], schema=schema,
                    traceparent=traceparent,
                    unrung=partial(_ready_undispatch, row_id=row_id, dispatched_at=dispatched_at)
                    if robust else None)
            for schema, run_id, branch, traceparent, row_id, dispatched_at in picked
        ]
        kept = next((ring for ring in rings if ring.task_name == "runs.advance"), None)  # first
        # in fair order: kept, it runs at once; rung, it may wait behind others in the broker
        if keep is not None and kept is not None:
            rings.remove(kept)
            transaction.on_commit(partial(keep.append, kept))
        doorbell_ring_all(rings, robust=robust)
    return len(picked)


def _ready_undispatch(*, row_id: int, dispatched_at: datetime) -> None:
    """Its task was not sent, as far as anyone knows (the broker refused it, or timed out: a
    push that timed out may still arrive when a hung broker resumes): back in line, for the
    next dispatcher rather than the watchdog's DISPATCH_REDELIVER_SECONDS. If it did arrive,
    the run's second message is harmless (one claim takes it; the other finds it leased or
    gone), though its tenant may then run one more than its cap until one of them ends."""
    try:
        ReadyRun.objects.filter(id=row_id, dispatched_at=dispatched_at).update(dispatched_at=None)
    except Exception:  # the watchdog puts it back in line all the same
        log.warning("ready row %s: not put back in line; the watchdog will", row_id,
                    exc_info=True)


def watchdog() -> dict[str, int]:
    """Put back in line what a worker was handed but is not running: a message the broker
    lost, a run whose lease expired (dead or frozen worker). Drop rows of runs that left."""
    now = timezone.now()
    stale = ReadyRun.objects.filter(
        dispatched_at__lt=now - timedelta(seconds=settings.DISPATCH_CHECK_AFTER_SECONDS)
    )
    by_schema: dict[str, list[ReadyRun]] = defaultdict(list)
    for row in stale:
        by_schema[row.schema_name].append(row)
    counts = {"requeued": 0, "dropped": 0}
    for schema, rows in by_schema.items():
        with schema_context(schema):
            verdicts = tick_handlers().runs_inspect_in_flight(rows=rows, now=now)
        for row, verdict in zip(rows, verdicts, strict=True):
            if verdict == "requeue":
                ReadyRun.objects.filter(id=row.id, dispatched_at=row.dispatched_at).update(
                    dispatched_at=None)
                counts["requeued"] += 1
            elif verdict == "drop":
                ReadyRun.objects.filter(id=row.id, dispatched_at=row.dispatched_at).delete()
                counts["dropped"] += 1
    if counts["requeued"] or counts["dropped"]:
        log.info("watchdog: %s", counts)
    return counts


def wakeups_fire(*, limit: int = 500) -> int:
    """Fire every due wakeup (sleeps and timeouts), each in its tenant's schema, each once.

    Each in a transaction of its own that locks the run before anything else (decision 0008):
    holding the wakeup rows while waiting for runs would deadlock with a cancel, which locks
    the run and then deletes its wakeups. A wakeup fired twice is stale the second time."""
    fired = 0
    due = list(Wakeup.objects.filter(due_at__lte=timezone.now()).order_by("due_at")[:limit])
    for wakeup in due:
        try:
            with schema_context(wakeup.schema_name):
                outcome = tick_handlers().wakeup_fire(run_id=wakeup.run_id, visit=wakeup.visit)
        except Exception:  # one broken run must not hold up every other timer
            log.exception("wakeup of run %s failed; retrying next tick", wakeup.run_id)
            continue
        # Fired (or stale): gone, unless the run parked again at this visit with a new due time.
        Wakeup.objects.filter(id=wakeup.id, due_at=wakeup.due_at).delete()
        log.info("wakeup %s visit %s: %s", wakeup.run_id, wakeup.visit, outcome)
        fired += 1
    return fired


# -- the due-index ---------------------------------------------------------------------------

def due_mark(*, what: str, at: datetime | None = None) -> None:
    """Something of the current tenant's `what` is due at `at` (now if None): its sweep visits
    the tenant by then. Call in the transaction that makes it due, after or with the write.

    Only ever lowers the row's time. It locks the row even when it changes nothing (PostgreSQL
    locks the conflicting row of ON CONFLICT DO UPDATE whatever its WHERE says), so a sweep
    that looks at this tenant now either waits for this transaction or is waited for."""
    with connection.cursor() as cursor:
        cursor.execute(due_mark_sql(), [what, at, connection.schema_name])


def due_mark_sql() -> str:
    """`due_mark`'s statement; parameters: what, at (None: now), the tenant's schema. Public
    tables only: under schema sharding it runs on the coordinator (decision 0023)."""
    return f"""
            INSERT INTO {DUE} AS d (tenant_id, schema_name, what, due_at)
            SELECT t.id, t.schema_name, %s, coalesce(%s, now())
              FROM public.tenants_tenant t WHERE t.schema_name = %s
            ON CONFLICT (schema_name, what) DO UPDATE SET due_at = EXCLUDED.due_at
             WHERE d.due_at IS NULL OR d.due_at > EXCLUDED.due_at"""


def due_sweep(*, what: str, visit: Callable[[], datetime | None], limit: int = 500) -> int:
    """Visit every active tenant whose `what` is due by the due-index, and no other.

    Each visit is a transaction of its own that holds the tenant's row (skipped if someone is
    marking it right now: it stays due for the next sweep). `visit()` runs in the tenant's
    schema, does what is due (rings a deliverer) and returns when the tenant's `what` is next
    due, at or before now if it still is (None: nothing pending); the row moves there, or to
    now if still due (behind the other due tenants). Nothing can become due unseen meanwhile:
    a `due_mark` of this tenant waits for the row and then lowers it again. Returns how many
    tenants were visited."""
    schemas = list(TenantDue.objects.filter(what=what, due_at__lte=Now(),
                                            tenant__status=Tenant.Status.ACTIVE)
                   .order_by("due_at").values_list("schema_name", flat=True)[:limit])
    visited = 0
    for schema in schemas:
        try:
            with transaction.atomic():
                row = (TenantDue.objects.select_for_update(skip_locked=True)
                       .filter(schema_name=schema, what=what, due_at__lte=Now()).first())
                if row is None:
                    continue
                with schema_context(schema):
                    next_due = visit()
                # still due: now, behind the other due tenants, so a limit never starves one
                TenantDue.objects.filter(id=row.id).update(
                    due_at=None if next_due is None else Greatest(Value(next_due), Now()))
        except Exception:  # one broken schema must not hold up every other tenant
            log.exception("%s sweep of %s failed; it stays due", what, schema)
            continue
        visited += 1
    return visited
