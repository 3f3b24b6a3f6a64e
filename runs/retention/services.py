"""Retention verbs: the archive pass (compact shallow runs, archive and prune runs past their
TTL, prune old inbound events), restore for audit, and rotating a tenant's data key (archive
keys re-wrapped; credentials, Slack secrets and workspace snapshots re-sealed by their apps).

Order of a chunk of runs' archival, all inside one transaction holding the runs' row locks:
read their rows -> per run, concurrently: serialize -> seal -> upload with its sha256, which the
store checks (else read back and compare) -> then, for the runs whose upload verified: Archive
rows -> prune (counts checked per run). A run that fails anywhere gets no Archive row and no
prune, so its hot rows stay; a crash rolls back the whole chunk. An archive object is written
once, never replaced: a re-run that finds the run's key taken uploads beside it and, once its
Archive row commits, deletes the run's other objects (docs/retention.md).
"""

import gzip
import hashlib
import json
import logging
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor, as_completed, wait
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from uuid import UUID

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from agentplatform.errors import ServiceError
from integrations.models import Credential
from integrations.services import credentials_reseal
from integrations.webhooks.models import SlackConnection
from integrations.webhooks.services import slack_secrets_reseal
from runs.agents import RetentionPolicy
from runs.approvals.services import inbound_events_prune
from runs.models import Checkpoint, Run
from sandboxes.models import WorkspaceSnapshot
from sandboxes.services import workspace_snapshots_reseal
from tenants.models import Tenant, TenantKey
from tenants.services import (
    TenantError,
    data_key_create,
    data_key_for_write,
    data_key_get,
    data_key_rotation_lock,
)

from . import envelope, selectors, store
from .envelope import ArchiveCorrupt, ArchiveError
from .models import Archive, RunRetention, TenantRetention
from .store import ArchiveStoreUnavailable

log = logging.getLogger(__name__)

FORMAT = "agentplatform.run-archive/1"

# Called after the object is uploaded and verified, before the Archive row and the prune:
# tests raise here to prove a crash at that point loses nothing and duplicates nothing.
after_upload: Callable[[UUID], None] | None = None


class ArchiveNotFound(ArchiveError):
    code = "not_found"


class ArchiveRaced(ArchiveError):
    """A run's rows changed between their read and the prune; `runs` says how, per run."""

    code = "archive_raced"

    def __init__(self, message: str, *, runs: dict[UUID, str] | None = None):
        super().__init__(message)
        self.runs = runs or {}


class RetentionError(ServiceError):
    """A retention setting or key retirement refused, with a message for the operator."""

    def __init__(self, message: str):
        super().__init__("retention_refused", message)


@dataclass
class PassReport:
    compacted_checkpoints: int = 0
    archived: int = 0
    discarded: int = 0
    failed: int = 0
    archived_bytes: int = 0
    pruned_events: int = 0  # inbound events past EVENT_DEDUPE_RETENTION_SECONDS
    stopped: str = ""  # why the pass stopped early, if it did: `chunk_stops_pass`

    def as_dict(self) -> dict:
        return asdict(self)


def archive_pass(*, tenant: Tenant, now: datetime | None = None, limit: int | None = None) -> PassReport:
    """One tenant's retention work (run in its schema): compact, then archive what is due, a
    chunk of runs per transaction, their uploads concurrent."""

    now = now or timezone.now()
    report = PassReport(compacted_checkpoints=shallow_compact(),
                        pruned_events=inbound_events_prune(now=now))
    due = selectors.runs_due(now=now, limit=limit or settings.RETENTION_BATCH_SIZE)
    if not due:
        return report
    concurrency = max(1, settings.RETENTION_UPLOAD_CONCURRENCY)
    chunk = max(1, settings.RETENTION_CHUNK_SIZE)
    uploader = store.uploader_open(concurrency=concurrency)  # one per pass: made once, shared
    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="archive-upload") as uploads:
        for start in range(0, len(due), chunk):
            done = runs_archive(tenant=tenant, due=due[start:start + chunk], uploads=uploads,
                                uploader=uploader)
            for archive in done.archives:
                if archive.status == Archive.Status.ARCHIVED:
                    report.archived += 1
                    report.archived_bytes += archive.size
                else:
                    report.discarded += 1
            report.failed += len(done.failures)
            if stopped := chunk_stops_pass(done):
                report.stopped = stopped  # the next chunk would fail the same way: stop here
                break
    if report.failed:
        log.warning("retention pass in %s: %s", tenant.schema_name, report.as_dict())
    return report


def chunk_stops_pass(done: "ChunkArchived") -> str:
    """Why a pass stops after this chunk, in words ("" if it goes on): S3 is unavailable, or the
    store refused every upload of the chunk that ended, two or more, as bytes that did not match
    their checksum, with nothing archived and one of them a run's first attempt. Then the path to
    the store changes the bytes, and the next chunk's runs would be sealed and sent for nothing.
    Runs refused again and again (their bytes, not the path) do not stop it: they would hold
    back every run behind them. The refused runs stay hot, recorded failed, for a later pass."""
    if unavailable := next((exc for exc in done.failures.values()
                            if isinstance(exc, ArchiveStoreUnavailable)), None):
        return str(unavailable)
    refused = [run_id for run_id, exc in done.failures.items()
               if isinstance(exc, store.UploadRefused)]
    if (len(refused) >= 2 and len(refused) == len(done.failures)
            and not any(archive.status == Archive.Status.ARCHIVED for archive in done.archives)
            and Archive.objects.filter(run_id__in=refused, attempts=1).exists()):
        return (f"the archive store refused all {len(refused)} uploads of a chunk: the bytes it "
                "received were not the ones sent")
    return ""


@dataclass
class ChunkArchived:
    archives: list[Archive] = field(default_factory=list)  # archived or discarded, and pruned
    failures: dict[UUID, Exception] = field(default_factory=dict)  # recorded failed, still hot


@dataclass(frozen=True)
class Upload:
    object_key: str
    sha256: str
    size: int
    sealed_key: bytes  # the object's own key, to be wrapped with the tenant's data key
    sweep: bool = False  # other objects of the run may exist (earlier attempts'): once this
    # upload's Archive row commits nothing can refer to them, and they are deleted


# Runs whose rows are read at once: their uploads start while the next ones are read.
ROWS_READ_AT_ONCE = 25


def runs_archive(*, tenant: Tenant, due: list[tuple[UUID, RetentionPolicy]], uploads: Executor,
                 uploader: store.Uploader) -> ChunkArchived:
    """Archive finished runs (unless their policy says not to) and prune their hot rows, in one
    transaction holding their row locks (`SKIP LOCKED`: a run another pass holds is left to it).
    Uploads run on `uploads`, sharing `uploader`; the Archive rows and the prune follow, for the
    runs whose upload verified. A run whose upload fails, or whose rows changed since they were
    read, is recorded failed and stays hot; the others are archived all the same."""
    schema, policies = tenant.schema_name, dict(due)
    done, locked = ChunkArchived(), []
    try:
        with transaction.atomic():
            ended = {run_id: (agent, finished_at) for run_id, agent, finished_at in
                     Run.objects.select_for_update(skip_locked=True)
                     .filter(id__in=list(policies), status__in=Run.FINISHED)
                     .order_by("finished_at").values_list("id", "agent", "finished_at")}
            locked = list(ended)
            if not locked:
                return done  # finished meanwhile by another pass, or locked by one right now
            version = tenant_key = None
            if any(policies[run_id].archive_required for run_id in locked):
                # Held FOR SHARE until the Archive rows commit: a retirement of it waits and sees them.
                version, tenant_key = data_key_for_write(tenant=tenant)
            counts: dict[UUID, dict[str, int]] = {}
            uploading: dict[Future, UUID] = {}
            try:
                for start in range(0, len(locked), ROWS_READ_AT_ONCE):
                    if store_unavailable(uploading):
                        break  # the runs not read yet wait for the next pass
                    for run_id, rows in selectors.runs_rows(
                            run_ids=locked[start:start + ROWS_READ_AT_ONCE]).items():
                        counts[run_id] = {table: len(rows_) for table, rows_ in rows.items()}
                        if policies[run_id].archive_required:
                            uploading[uploads.submit(
                                run_upload, schema=schema, run_id=run_id, rows=rows,
                                version=version, uploader=uploader)] = run_id
                verified = uploads_verified(uploading, failures=done.failures)
            finally:  # whatever ended the reads, no upload outlives the chunk's row locks
                uploads_settled(uploading)
            fields = {run_id: {"status": Archive.Status.DISCARDED} for run_id in counts
                      if not policies[run_id].archive_required}
            for run_id, upload in verified.items():
                fields[run_id] = {
                    "status": Archive.Status.ARCHIVED, "object_key": upload.object_key,
                    "sha256": upload.sha256, "size": upload.size,
                    "sealed_key_version": version, "key_version": version,
                    "wrapped_key": envelope.key_wrap(upload.sealed_key, tenant_key=tenant_key,
                                                     tenant=schema, run_id=str(run_id),
                                                     key_version=version)}
            while fields:
                try:
                    # A savepoint: a run whose rows changed is taken out, and the others pruned again.
                    with transaction.atomic():
                        done.archives = archives_record(fields=fields, counts=counts, ended=ended)
                        runs_prune(counts={run_id: counts[run_id] for run_id in fields})
                    break
                except ArchiveRaced as raced:
                    if not raced.runs:
                        raise
                    for run_id, message in raced.runs.items():
                        done.failures[run_id] = ArchiveRaced(message)
                        del fields[run_id]
                    done.archives = []
            sweep = {run_id: verified[run_id].object_key for run_id in fields
                     if run_id in verified and verified[run_id].sweep}
            if sweep:  # the archives are recorded: nothing refers to their runs' other objects
                transaction.on_commit(lambda: runs_objects_sweep(
                    schema=schema, keep=sweep, client=uploader.client), robust=True)
    except Exception as exc:  # the transaction rolled back: no run of the chunk was pruned
        if not locked:
            raise
        done.archives = []
        done.failures = {run_id: done.failures.get(run_id, exc) for run_id in locked}
    for run_id, exc in done.failures.items():
        archive_failure_record(run_id=run_id, error=exc)
    return done


def uploads_settled(uploading: dict[Future, UUID]) -> None:
    """Cancel the uploads not started and wait for the others."""
    for future in uploading:
        future.cancel()
    wait(uploading)


def runs_objects_sweep(*, schema: str, keep: dict[UUID, str], client) -> None:
    for run_id, key in keep.items():
        store.objects_sweep(prefix=store.run_objects_prefix(schema=schema, run_id=run_id),
                            keep=key, client=client)


def store_unavailable(uploading: dict[Future, UUID]) -> bool:
    return any(future.done() and not future.cancelled()
               and isinstance(future.exception(), ArchiveStoreUnavailable) for future in uploading)


def uploads_verified(uploading: dict[Future, UUID], *,
                     failures: dict[UUID, Exception]) -> dict[UUID, Upload]:
    """Wait for the uploads; the verified ones, by run. A failure goes into `failures`; once S3 is
    unavailable, uploads not yet started are cancelled (those runs wait for the next pass)."""
    uploaded: dict[UUID, Upload] = {}
    for future in as_completed(uploading):
        run_id = uploading[future]
        if future.cancelled():
            continue
        try:
            uploaded[run_id] = future.result()
        except Exception as exc:
            failures[run_id] = exc
            if isinstance(exc, ArchiveStoreUnavailable):
                for later in uploading:
                    later.cancel()  # those already uploading finish; the rest wait for the next pass
    for run_id in list(uploaded):
        if after_upload is not None:  # in this thread, inside the transaction, as a crash would be
            try:
                after_upload(run_id)
            except Exception as exc:
                failures[run_id] = exc
                del uploaded[run_id]
    return uploaded


def run_upload(*, schema: str, run_id: UUID, rows: dict[str, list[dict]], version: int,
               uploader: store.Uploader) -> Upload:
    """One run's archive sealed under a fresh object key, uploaded and checked.
    Runs in an upload thread: no database here."""
    sealed = envelope.seal(archive_body(tenant=schema, run_id=run_id, rows=rows),
                           tenant=schema, run_id=str(run_id), key_version=version)
    size, sealed_key = len(sealed.blob), sealed.object_key
    if uploader.writes_once:
        key = store.object_key_for(schema=schema, run_id=run_id)
        try:
            return Upload(key, store.object_put_verified(key=key, blob=sealed.blob,
                                                         uploader=uploader), size, sealed_key)
        except store.ObjectExists:
            pass  # left by an attempt that crashed or outlived its pass: kept, and written beside
    # A key named after these bytes: the run's is taken, or the store would not keep it.
    key = store.object_key_for(schema=schema, run_id=run_id, blob=sealed.blob)
    try:
        digest = store.object_put_verified(key=key, blob=sealed.blob, uploader=uploader)
    except store.ObjectExists:  # these bytes, stored by a retried PUT whose answer was lost
        digest = store.object_matches(key=key, blob=sealed.blob, uploader=uploader)
    return Upload(key, digest, size, sealed_key, sweep=True)


ARCHIVE_FIELDS = ("agent", "status", "object_key", "sha256", "size", "sealed_key_version",
                  "key_version", "wrapped_key", "counts", "run_finished_at", "archived_at", "error",
                  "updated_at")


def archives_record(*, fields: dict[UUID, dict], counts: dict[UUID, dict[str, int]],
                    ended: dict[UUID, tuple[str, datetime]]) -> list[Archive]:
    """Upsert the runs' Archive rows (one statement); `attempts` is kept. `ended`: each run's
    agent and end."""
    now = timezone.now()
    archives = [
        Archive(run_id=run_id, agent=ended[run_id][0], counts=counts[run_id],
                run_finished_at=ended[run_id][1], archived_at=now, error="",
                **{"object_key": "", "sha256": "", "size": 0, "sealed_key_version": None,
                   "key_version": None, "wrapped_key": None, **run_fields})
        for run_id, run_fields in fields.items()]
    Archive.objects.bulk_create(archives, update_conflicts=True, unique_fields=["run_id"],
                                update_fields=list(ARCHIVE_FIELDS))
    return archives


def archive_body(*, tenant: str, run_id: UUID, rows: dict[str, list[dict]]) -> bytes:
    """JSON Lines, gzipped: a header line, then one {"table", "row"} line per row."""
    counts = {table: len(table_rows) for table, table_rows in rows.items()}
    lines = [json.dumps({"archive": FORMAT, "tenant": tenant, "run": str(run_id), "counts": counts})]
    lines += [json.dumps({"table": table, "row": row}, separators=(",", ":"),
                         default=selectors.json_default)
              for table, table_rows in rows.items() for row in table_rows]
    return gzip.compress(("\n".join(lines) + "\n").encode(), compresslevel=6, mtime=0)


def runs_prune(*, counts: dict[UUID, dict[str, int]]) -> None:
    """Delete the runs' hot rows through the one path past the append-only guard, a statement
    per table for all of them. Refuses (ArchiveRaced naming each such run, and so rolls back) if
    any table holds a different number of a run's rows than was archived."""
    if not connection.in_atomic_block:
        raise RuntimeError("runs_prune must run inside the archive's transaction")
    qn = connection.ops.quote_name
    run_ids = list(counts)
    found: dict[str, dict[UUID, int]] = {}
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL agentplatform.allow_prune = 'on'")
        for table in selectors.run_tables():
            name, column = qn(table.name), qn(table.field.column)
            owner = {table.key(run_id): run_id for run_id in run_ids}
            if table.outlives_run:
                cursor.execute(f"""
                    WITH hit AS (SELECT ctid, {column} AS owner FROM {name}
                                  WHERE {column} = ANY(%s) FOR UPDATE),
                         gone AS (UPDATE {name} t SET {column} = NULL FROM hit
                                   WHERE t.ctid = hit.ctid RETURNING hit.owner)
                    SELECT owner, count(*) FROM gone GROUP BY owner""", [list(owner)])
            else:
                cursor.execute(f"""
                    WITH gone AS (DELETE FROM {name} WHERE {column} = ANY(%s) RETURNING {column})
                    SELECT {column}, count(*) FROM gone GROUP BY {column}""", [list(owner)])
            found[table.name] = {owner[key]: n for key, n in cursor.fetchall()}
        raced = {
            run_id: f"run {run_id}: {table} had {n.get(run_id, 0)} rows at prune time but "
                    f"{counts[run_id].get(table, 0)} were archived"
            for table, n in found.items() for run_id in run_ids
            if n.get(run_id, 0) != counts[run_id].get(table, 0)}
        if raced:
            raise ArchiveRaced(f"{len(raced)} run(s) changed since they were read", runs=raced)
        runs = qn(Run._meta.db_table)
        forked_from = qn(Run._meta.get_field("forked_from").column)
        cursor.execute(f"UPDATE {runs} SET {forked_from} = NULL WHERE {forked_from} = ANY(%s)",
                       [run_ids])
        cursor.execute(f"DELETE FROM {runs} WHERE id = ANY(%s)", [run_ids])


def archive_failure_record(*, run_id: UUID, error: Exception) -> None:
    message = f"{type(error).__name__}: {error}"[:2000]
    log.warning("archiving run %s failed: %s", run_id, message)
    updated = (Archive.objects.filter(run_id=run_id).exclude(status=Archive.Status.ARCHIVED)
               .update(status=Archive.Status.FAILED, error=message, attempts=F("attempts") + 1,
                       updated_at=timezone.now()))
    if not updated and not Archive.objects.filter(run_id=run_id).exists():
        agent = Run.objects.filter(id=run_id).values_list("agent", flat=True).first() or ""
        Archive.objects.create(run_id=run_id, agent=agent, status=Archive.Status.FAILED,
                               error=message, attempts=1)


def shallow_compact() -> int:
    """Delete every checkpoint but the latest of each run whose policy is shallow. Safe while the
    run is running: the engine only ever reads (and resumes from) the latest checkpoint."""
    runs_sql, params = selectors.shallow_runs().values("id").query.sql_with_params()
    table = connection.ops.quote_name(Checkpoint._meta.db_table)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL agentplatform.allow_prune = 'on'")
        cursor.execute(f"""
            DELETE FROM {table} c
             USING (SELECT run_id, max(visit) AS latest FROM {table}
                     WHERE run_id IN ({runs_sql})
                     GROUP BY run_id HAVING count(*) > 1) l
             WHERE c.run_id = l.run_id AND c.visit < l.latest
        """, params)
        return cursor.rowcount


TTL_DAYS_MAX = 3650  # a tenant's or a run's: ten years


def run_retention_set(*, run_id: UUID, history: str | None = None, ttl=None,
                      archive_required: bool | None = None) -> RunRetention:
    """Override the agent's retention policy for one run (null fields keep the agent's). The
    TTL is bounded as the tenant's is: a run's due time is computed in SQL, where a TTL past
    the timestamp's range would fail its tenant's every pass."""
    if history not in (None, "full", "shallow"):
        raise RetentionError(f"history must be 'full' or 'shallow', not {history!r}")
    if ttl is not None and not timedelta(0) < ttl <= timedelta(days=TTL_DAYS_MAX):
        raise RetentionError(f"the time to live must be more than 0 and at most {TTL_DAYS_MAX} "
                             f"days, not {ttl}")
    override, _ = RunRetention.objects.update_or_create(
        run_id=run_id, defaults={"history": history, "ttl": ttl, "archive_required": archive_required})
    return override


def tenant_retention_set(*, history: str, ttl_days: float, by: str) -> TenantRetention:
    """Set the current tenant's policy for agents that declare none (history and TTL; the
    platform keeps deciding whether runs are archived). Used from the next archive pass."""
    if history not in ("full", "shallow"):
        raise RetentionError(f"history must be 'full' or 'shallow', not {history!r}")
    if not 0 < ttl_days <= TTL_DAYS_MAX:
        raise RetentionError(f"the time to live must be more than 0 and at most "
                             f"{TTL_DAYS_MAX} days, not {ttl_days:g}")
    own, _ = TenantRetention.objects.update_or_create(
        id=1, defaults={"history": history, "ttl": timedelta(days=ttl_days), "updated_by": by})
    return own


def tenant_retention_clear() -> bool:
    """Back to the platform's default; False when the tenant had no policy of its own."""
    deleted, _ = TenantRetention.objects.all().delete()
    return deleted > 0


def archive_restore(*, tenant: Tenant, run_id: UUID) -> dict:
    """Fetch, verify and decrypt a run's archive; its history, read-only, as the API shows it."""
    archive = Archive.objects.filter(run_id=run_id, status=Archive.Status.ARCHIVED).first()
    if archive is None:
        raise ArchiveNotFound("This run has no archive.")
    rows = archive_read(archive=archive, tenant=tenant)
    return {
        **selectors.history_from_rows(rows),
        "archive": {"object_key": archive.object_key, "sha256": archive.sha256,
                    "size": archive.size, "key_version": archive.key_version,
                    "archived_at": archive.archived_at, "counts": archive.counts},
    }


def archive_read(*, archive: Archive, tenant: Tenant) -> dict[str, list[dict]]:
    """The archived rows, by table, after checking size, sha256, key, AEAD tag and row counts.
    `tenant` is whose key opens it: another tenant's key is refused."""
    run_id = str(archive.run_id)
    blob = store.object_get(key=archive.object_key)
    where = f"archive of run {run_id} ({archive.object_key})"
    if len(blob) != archive.size:
        raise ArchiveCorrupt(f"{where}: the object is {len(blob)} bytes but {archive.size} were "
                             "archived: truncated or replaced")
    digest = hashlib.sha256(blob).hexdigest()
    if digest != archive.sha256:
        raise ArchiveCorrupt(f"{where}: sha256 {digest[:16]}… does not match the recorded "
                             f"{archive.sha256[:16]}…: the object was altered")
    _, tenant_key = data_key_get(tenant=tenant, version=archive.key_version)
    object_key = envelope.key_unwrap(archive.wrapped_key, tenant_key=tenant_key,
                                     tenant=tenant.schema_name, run_id=run_id,
                                     key_version=archive.key_version)
    body = envelope.unseal(blob, object_key=object_key, tenant=tenant.schema_name, run_id=run_id,
                           key_version=archive.sealed_key_version)
    try:
        header, *lines = [json.loads(line) for line in gzip.decompress(body).splitlines() if line]
    except (OSError, EOFError, ValueError) as exc:
        raise ArchiveCorrupt(f"{where}: the body does not decompress into JSON Lines: {exc}") from exc
    if header.get("archive") != FORMAT or header.get("run") != run_id:
        raise ArchiveCorrupt(f"{where}: unexpected header {header}")
    rows: dict[str, list[dict]] = {table: [] for table in header["counts"]}
    for line in lines:
        rows.setdefault(line["table"], []).append(line["row"])
    found = {table: len(table_rows) for table, table_rows in rows.items()}
    if found != archive.counts or found != header["counts"]:
        raise ArchiveCorrupt(f"{where}: row counts {found} differ from the recorded {archive.counts}")
    return rows


def archive_keys_rewrap(*, tenant: Tenant, to_version: int | None = None) -> int:
    """Re-wrap every archive's object key under the tenant's key `to_version` (default: the
    newest active one). Bodies and their sha256 do not change. Idempotent; returns rows changed."""
    version, new_key = data_key_get(tenant=tenant, version=to_version)
    old_keys: dict[int, bytes] = {}
    changed = 0
    pending = (Archive.objects.filter(status=Archive.Status.ARCHIVED).exclude(key_version=version)
               .values_list("pk", flat=True))
    for pk in list(pending):
        with transaction.atomic():
            archive = Archive.objects.select_for_update().get(pk=pk)
            if archive.key_version == version:
                continue
            if archive.key_version not in old_keys:
                old_keys[archive.key_version] = data_key_get(tenant=tenant,
                                                             version=archive.key_version)[1]
            binding = {"tenant": tenant.schema_name, "run_id": str(archive.run_id)}
            object_key = envelope.key_unwrap(archive.wrapped_key, tenant_key=old_keys[archive.key_version],
                                             key_version=archive.key_version, **binding)
            Archive.objects.filter(pk=pk).update(
                key_version=version,
                wrapped_key=envelope.key_wrap(object_key, tenant_key=new_key, key_version=version,
                                              **binding),
            )
            changed += 1
    return changed


RETIRE_ATTEMPTS = 3


def data_key_rotate(*, tenant: Tenant, retire_old: bool = False) -> TenantKey:
    """A new data key version for the tenant, and everything sealed under an older one re-sealed
    under it: archive keys (re-wrapped; bodies untouched), connector credentials, Slack signing
    secrets and workspace snapshots. Optionally the older versions retired, after which they open
    nothing. Run in the tenant's schema; idempotent, so an interrupted rotation is run again.
    One rotation of a tenant at a time (`data_key_rotation_lock`); another is refused.

    A writer that took the old version just before the new one existed commits under it after
    the re-seal; retiring waits for it and refuses, so the re-seal runs again, then the retire."""
    try:
        with data_key_rotation_lock(tenant=tenant):
            key = data_key_create(tenant=tenant)
            data_key_reseal(tenant=tenant, to_version=key.version)
            if retire_old:
                older = tenant.data_keys.filter(retired_at=None, version__lt=key.version)
                for old in list(older.order_by("version")):
                    for attempt in range(RETIRE_ATTEMPTS):
                        try:
                            data_key_retire(tenant=tenant, version=old.version)
                            break
                        except DataKeyInUse:
                            if attempt == RETIRE_ATTEMPTS - 1:
                                raise
                            data_key_reseal(tenant=tenant, to_version=key.version)
    except TenantError as exc:
        if exc.code != "data_key_rotation_running":
            raise
        raise RetentionError(exc.message) from None
    return key


def data_key_reseal(*, tenant: Tenant, to_version: int) -> dict[str, int]:
    """Re-seal everything of the tenant under data key `to_version`; returns what changed."""
    return {
        "archives": archive_keys_rewrap(tenant=tenant, to_version=to_version),
        "credentials": credentials_reseal(tenant=tenant, to_version=to_version),
        "slack_secrets": slack_secrets_reseal(tenant=tenant, to_version=to_version),
        "workspace_snapshots": workspace_snapshots_reseal(tenant=tenant, to_version=to_version),
    }


def data_key_users(*, tenant: Tenant, version: int) -> dict[str, int]:
    """What is still sealed under data key `version` of the tenant (run in its schema)."""
    in_use = {
        "archive(s)": Archive.objects.filter(key_version=version).count(),
        "credential(s)": Credential.objects.filter(key_version=version).count(),
        "Slack signing secret(s)": SlackConnection.objects.filter(
            tenant=tenant, data_key_version=version).count(),
        "workspace snapshot(s)": WorkspaceSnapshot.objects.filter(key_version=version).count(),
    }
    return {what: count for what, count in in_use.items() if count}


class DataKeyInUse(RetentionError):
    """Something is still sealed under the data key version being retired."""


def data_key_retire(*, tenant: Tenant, version: int) -> None:
    """Mark a data key version retired (it opens nothing afterwards); refused while anything is
    still sealed under it. Its row is locked FOR UPDATE before counting, which waits for every
    writer holding it FOR SHARE (`data_key_for_write`) to commit, so none is missed."""
    with transaction.atomic():
        row = tenant.data_keys.select_for_update().filter(version=version, retired_at=None).first()
        if row is None:
            return  # retired already, or never existed
        in_use = data_key_users(tenant=tenant, version=version)
        if in_use:
            listed = ", ".join(f"{count} {what}" for what, count in in_use.items())
            raise DataKeyInUse(f"{listed} of {tenant.schema_name} are still wrapped under data "
                               f"key v{version}: re-seal them first (rotate_data_key)")
        if not tenant.data_keys.filter(retired_at=None).exclude(version=version).exists():
            raise RetentionError(f"v{version} is the only active data key of {tenant.schema_name}")
        TenantKey.objects.filter(pk=row.pk).update(retired_at=timezone.now())
