"""Sandbox verbs: run a step's command in its run's jail (recorded, replayed on re-run), and keep
the run's workspace durable as encrypted snapshots in S3.

A run's workspace lives on the worker under SANDBOX_WORKSPACE_ROOT/<schema>/<run id>/; the
truth is the newest `WorkspaceSnapshot`. Beside the workspace, `meta.json` says which snapshot
the local copy was restored from or saved as, and whether a process has changed it since.
Before a step's first sandbox command, a local copy that is not exactly that snapshot (another
worker moved the run on, or a killed worker left half a step in it) is replaced by a restore.

A fan-out branch works in a workspace of its own (<run id>.<visit>-b<index>/ beside the run's),
started from the run's newest snapshot before the fan-out and snapshotted under its own scope:
parallel branches never see each other's files, and the run's workspace (what the join step
sees) is untouched by them; a branch's results travel through `finish(value)`.

A recorded command is replayed (not run again) when its workspace changes are known to be in
the local copy: it is `durable` (its step's snapshot was taken), or this process ran it.

A snapshot is packed, sealed, uploaded and fetched through size-capped temporary files beside
the workspaces (never whole in memory): a workspace over its quota (apparent bytes or entries)
is refused before anything is compressed, and a restore refuses members over the quota.
"""

import gzip
import hashlib
import io
import json
import logging
import os
import socket
import stat
import tarfile
import tempfile
import uuid
from pathlib import Path
from typing import Any, BinaryIO
from uuid import UUID

from botocore.exceptions import BotoCoreError, ClientError
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from django.conf import settings
from django.db import DataError, connection, transaction

from agentplatform.s3 import s3_client
from agentplatform.trees import tree_remove
from tenants.models import Tenant
from tenants.services import TenantError, data_key_for_write, data_key_get

from .egress import EgressPolicy, EgressRule, EgressRuleInvalid, egress_rule_parse
from .jail import (
    Limits,
    SandboxError,
    SandboxResult,
    host_uid,
    sandbox_execute,
    sandbox_probe,
    workspace_chown,
    workspace_open,
    workspace_read,
    workspace_usage,
)
from .models import SandboxEgressRule, SandboxExecution, WorkspaceSnapshot
from .selectors import egress_rules

log = logging.getLogger("sandboxes.services")

SNAPSHOT_MAGIC = b"APWS1\n"  # one AES-GCM message (snapshots before chunking; read only)
SNAPSHOT_MAGIC_CHUNKED = b"APWS2\n"  # then a nonce prefix, then sealed chunks
SNAPSHOT_CHUNK_BYTES = 1024 * 1024
_LAST, _MORE = b"L", b"M"
_process_token: tuple[int, str] | None = None


def process_token() -> str:
    """Names this process in meta.json; new after a fork, so prefork children differ."""
    global _process_token
    if _process_token is None or _process_token[0] != os.getpid():
        _process_token = (os.getpid(), f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}")
    return _process_token[1]


def run_dir(*, schema: str, run_id: UUID, scope: str = "") -> Path:
    """The run's local workspace directory; or, for a fan-out branch's `scope`, the branch's."""
    name = f"{run_id}.{scope.replace('/', '-')}" if scope else str(run_id)
    return Path(settings.SANDBOX_WORKSPACE_ROOT) / schema / name


def snapshot_object_key(*, schema: str, run_id: UUID, visit: int, scope: str = "",
                        unique: bool = False) -> str:
    """Where a snapshot is stored; `unique`: a key never written before, as every write uses."""
    name = scope.replace("/", "-") if scope else str(visit)
    suffix = f".{uuid.uuid4().hex[:12]}" if unique else ""
    return f"tenants/{schema}/workspaces/{run_id}/{name}{suffix}.tar.gz.enc"


def _associated_data(schema: str, run_id: UUID, visit: int, scope: str) -> bytes:
    branch = f"|{scope}" if scope else ""  # a branch's snapshot never opens as the run's
    return f"agentplatform workspace|{schema}|{run_id}|{visit}{branch}".encode()


def _tenant(schema: str):
    return Tenant.objects.get(schema_name=schema)


# -- local copy --------------------------------------------------------------------------------

class LocalWorkspace:
    """The run's (or one fan-out branch's) workspace directory on this worker and its meta.json."""

    def __init__(self, *, schema: str, run_id: UUID, scope: str = ""):
        self.dir = run_dir(schema=schema, run_id=run_id, scope=scope)
        self.path = self.dir / "workspace"
        self.meta_path = self.dir / "meta.json"

    def meta(self) -> dict[str, Any] | None:
        try:
            return json.loads(self.meta_path.read_text())
        except (FileNotFoundError, ValueError):
            return None

    def meta_write(self, **meta) -> None:
        tmp = self.meta_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(meta))
        os.replace(tmp, self.meta_path)

    def reset(self) -> None:
        """An empty workspace only the jail's host uid can enter."""
        tree_remove(self.path)  # however deep the jail nested it
        self.dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir.parent, 0o711)
        os.chmod(self.dir, 0o711)
        self.path.mkdir(mode=0o700)
        uid = host_uid()
        if uid is not None:
            workspace_chown(self.path, uid)


def snapshot_max_bytes() -> int:
    """The most a snapshot of a workspace within its quota can take, compressed and sealed:
    its apparent bytes, a tar header (and padding) per entry, and a margin for gzip and
    AES-GCM framing on incompressible data."""
    tar = settings.SANDBOX_WORKSPACE_MAX_BYTES + 1024 * (settings.SANDBOX_WORKSPACE_MAX_FILES + 2)
    return tar + tar // 100 + 64 * 1024


class _CappedFile:
    """A write-only view of a file that refuses to grow past `cap` bytes."""

    def __init__(self, file: BinaryIO, cap: int):
        self.file, self.cap, self.written = file, cap, 0

    def write(self, data: bytes) -> int:
        self.written += len(data)
        if self.written > self.cap:
            raise SandboxError(f"workspace snapshot would exceed {self.cap} bytes: refused")
        return self.file.write(data)

    def flush(self) -> None:
        self.file.flush()


def _scratch() -> tempfile.TemporaryFile:
    """A temporary file on the workspaces' disk (TMPDIR may be a tmpfs, i.e. memory)."""
    directory = Path(settings.SANDBOX_WORKSPACE_ROOT) / ".tmp"
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    return tempfile.TemporaryFile(dir=directory)


def workspace_pack(path: Path, out: BinaryIO, *, max_bytes: int, max_files: int) -> int:
    """Write a tar.gz of the workspace to `out`; return its regular-file count. Only regular
    files, directories and symlinks that stay inside are stored (FIFOs, sockets, devices, links
    pointing out are left out); nothing is followed, files are opened without blocking. A
    workspace over `max_bytes` (apparent) or `max_files` entries is refused before packing."""
    size, count = workspace_usage(path, max_files=max_files)
    if size > max_bytes or count > max_files:
        raise SandboxError(
            f"the workspace holds {size} bytes in {count}{'+' if count > max_files else ''} "
            f"entries, over its quota of {max_bytes} bytes and {max_files} entries: "
            "it was not snapshotted")
    root = path.resolve()
    files = 0
    with gzip.GzipFile(fileobj=out, mode="wb", compresslevel=6, mtime=0) as gz, \
            tarfile.open(fileobj=gz, mode="w|") as tar:
        stack = [root]
        while stack:
            directory = stack.pop()
            for entry in sorted(os.scandir(directory), key=lambda e: e.name, reverse=True):
                info = entry.stat(follow_symlinks=False)
                name = os.path.relpath(entry.path, root)
                member = tarfile.TarInfo(name)
                member.mtime, member.mode = info.st_mtime, stat.S_IMODE(info.st_mode) & 0o777
                if stat.S_ISDIR(info.st_mode):
                    member.type = tarfile.DIRTYPE
                    tar.addfile(member)
                    stack.append(Path(entry.path))
                elif stat.S_ISLNK(info.st_mode):
                    target = os.readlink(entry.path)
                    inside = Path(os.path.normpath(Path(entry.path).parent / target))
                    if os.path.isabs(target) or not inside.is_relative_to(root):
                        continue  # it would not be restored
                    member.type, member.linkname = tarfile.SYMTYPE, target
                    tar.addfile(member)
                elif stat.S_ISREG(info.st_mode):
                    fd = workspace_open(Path(entry.path), os.O_RDONLY, name=name)
                    with os.fdopen(fd, "rb") as source:
                        member.size = os.fstat(fd).st_size
                        tar.addfile(member, source)
                    files += 1
    return files


def workspace_unpack(source: BinaryIO, path: Path, *, max_bytes: int, max_files: int) -> None:
    """Extract a tar.gz (a seekable file) into `path`. Refuses (SandboxError) a snapshot whose
    members add up to more than `max_bytes` or `max_files`; leaves out members that are not
    regular files, directories or symlinks, and those that leave `path` (traversal, links out)."""
    dest = str(path)
    with tarfile.open(fileobj=source, mode="r:gz") as tar:
        accepted, total, count = [], 0, 0
        for member in tar:  # headers only, so a bomb is refused before it is written
            count += 1
            total += max(0, member.size)
            if count > max_files or total > max_bytes:
                raise SandboxError(
                    f"workspace snapshot holds more than {max_bytes} bytes or {max_files} "
                    f"entries (at {member.name!r}): not restored")
            if not (member.isreg() or member.isdir() or member.issym()):
                continue  # FIFOs, devices, hard links: never made by workspace_pack
            try:
                accepted.append(tarfile.data_filter(member, dest))
            except tarfile.FilterError:
                continue
        tar.extractall(path, members=accepted, filter="data")


def _chunk_nonce(prefix: bytes, index: int) -> bytes:
    return prefix + index.to_bytes(4, "big")


def _chunk_ad(base: bytes, index: int, flag: bytes) -> bytes:
    return base + b"|chunk|" + str(index).encode() + b"|" + flag


def snapshot_seal_stream(source: BinaryIO, sink: BinaryIO, *, key: bytes, schema: str,
                         run_id: UUID, visit: int, scope: str = "") -> None:
    """AES-256-GCM in chunks: each sealed with its index and whether it is the last as
    associated data, so chunks cannot be reordered, dropped or the snapshot cut short."""
    aead, prefix = AESGCM(key), os.urandom(8)
    base = _associated_data(schema, run_id, visit, scope)
    sink.write(SNAPSHOT_MAGIC_CHUNKED + prefix)
    index, chunk = 0, source.read(SNAPSHOT_CHUNK_BYTES)
    while True:
        following = source.read(SNAPSHOT_CHUNK_BYTES)
        flag = _MORE if following else _LAST
        sealed = aead.encrypt(_chunk_nonce(prefix, index), chunk, _chunk_ad(base, index, flag))
        sink.write(flag + len(sealed).to_bytes(4, "big") + sealed)
        if flag == _LAST:
            return
        index, chunk = index + 1, following


def snapshot_open_stream(source: BinaryIO, sink: BinaryIO, *, key: bytes, schema: str,
                         run_id: UUID, visit: int, scope: str = "") -> None:
    base = _associated_data(schema, run_id, visit, scope)
    magic = source.read(len(SNAPSHOT_MAGIC))
    if magic == SNAPSHOT_MAGIC:
        body = source.read()
        sink.write(AESGCM(key).decrypt(body[:12], body[12:], base))
        return
    if magic != SNAPSHOT_MAGIC_CHUNKED:
        raise SandboxError("workspace snapshot has an unknown format")
    aead, prefix, index = AESGCM(key), source.read(8), 0
    while True:
        head = source.read(5)
        flag, length = head[:1], int.from_bytes(head[1:], "big")
        if len(head) != 5 or flag not in (_LAST, _MORE) or \
                not 16 <= length <= SNAPSHOT_CHUNK_BYTES + 16:
            raise SandboxError("workspace snapshot is cut short or corrupt")
        sink.write(aead.decrypt(_chunk_nonce(prefix, index), source.read(length),
                                _chunk_ad(base, index, flag)))
        if flag == _LAST:
            if source.read(1):
                raise SandboxError("workspace snapshot has data after its last chunk")
            return
        index += 1


def snapshot_seal(data: bytes, *, key: bytes, schema: str, run_id: UUID, visit: int,
                  scope: str = "") -> bytes:
    sink = io.BytesIO()
    snapshot_seal_stream(io.BytesIO(data), sink, key=key, schema=schema, run_id=run_id,
                         visit=visit, scope=scope)
    return sink.getvalue()


def snapshot_open(blob: bytes, *, key: bytes, schema: str, run_id: UUID, visit: int,
                  scope: str = "") -> bytes:
    sink = io.BytesIO()
    snapshot_open_stream(io.BytesIO(blob), sink, key=key, schema=schema, run_id=run_id,
                         visit=visit, scope=scope)
    return sink.getvalue()


def workspace_snapshot(*, schema: str, run_id: UUID, visit: int, path: Path,
                       scope: str = "") -> WorkspaceSnapshot:
    """Compress, encrypt (tenant data key; tenant, run, visit and a branch's scope as associated
    data) and upload the workspace; record it. Re-taking the snapshot of a visit (of the run, or
    of one branch: `scope`) replaces it.

    Every write goes to an object key of its own, the row moves to it in one transaction, and the
    superseded object is deleted after the commit: a crash in between leaves an extra object,
    never a row whose object was overwritten."""

    tenant = _tenant(schema)
    object_key = snapshot_object_key(schema=schema, run_id=run_id, visit=visit, scope=scope,
                                     unique=True)
    with _scratch() as packed, _scratch() as sealed:
        count = workspace_pack(path, _CappedFile(packed, snapshot_max_bytes()),
                               max_bytes=settings.SANDBOX_WORKSPACE_MAX_BYTES,
                               max_files=settings.SANDBOX_WORKSPACE_MAX_FILES)
        with transaction.atomic():
            # The key is held FOR SHARE until the row commits: a retirement of it waits and sees it.
            version, key = data_key_for_write(tenant=tenant)
            packed.seek(0)
            snapshot_seal_stream(packed, sealed, key=key, schema=schema, run_id=run_id,
                                 visit=visit, scope=scope)
            size = sealed.tell()
            sealed.seek(0)
            digest = hashlib.file_digest(sealed, "sha256").hexdigest()
            sealed.seek(0)
            try:
                s3_client().put_object(Bucket=settings.S3_BUCKET, Key=object_key, Body=sealed,
                                       ContentLength=size, Metadata={"key-version": str(version)})
            except (BotoCoreError, ClientError) as exc:
                raise _store_unavailable("store", object_key, exc) from None
            # Under the row lock, as a key rotation re-sealing this snapshot is.
            previous = (WorkspaceSnapshot.objects.select_for_update()
                        .filter(run_id=run_id, visit=visit, scope=scope)
                        .values_list("object_key", flat=True).first())
            snapshot, _ = WorkspaceSnapshot.objects.update_or_create(
                run_id=run_id, visit=visit, scope=scope,
                defaults={"object_key": object_key, "key_version": version, "size_bytes": size,
                          "file_count": count, "sha256": digest},
            )
    if previous and previous != object_key:
        _superseded_delete(previous)
    return snapshot


def workspace_restore(*, schema: str, snapshot: WorkspaceSnapshot, path: Path) -> None:
    """Fetch, verify, decrypt and unpack `snapshot` into the (empty) workspace `path`.

    No lock is held across S3 (parallel fan-out branches restore the same snapshot at once): the
    row is read, its object fetched (through a capped temporary file) and checked against it; if
    a re-seal or a re-take moved the row meanwhile (the object is gone or no longer matches), it
    is read and fetched once more."""
    tenant = _tenant(schema)
    cap = snapshot_max_bytes() + 64 * 1024  # the chunks' framing on top
    with _scratch() as sealed, _scratch() as packed:
        for attempt in range(2):
            row = WorkspaceSnapshot.objects.get(pk=snapshot.pk)
            if row.size_bytes > cap:
                raise SandboxError(f"workspace snapshot {row.object_key} is larger than {cap} bytes")
            sealed.seek(0)
            sealed.truncate()
            try:
                digest = _snapshot_fetch(row.object_key, sealed, cap=cap)
            except ClientError as exc:
                if attempt == 0 and _moved(row):
                    continue
                raise _store_unavailable("read", row.object_key, exc) from None
            except BotoCoreError as exc:
                raise _store_unavailable("read", row.object_key, exc) from None
            if digest != row.sha256:
                if attempt == 0 and _moved(row):
                    continue
                raise SandboxError(f"workspace snapshot {row.object_key} does not match its record")
            try:
                _, key = data_key_get(tenant=tenant, version=row.key_version)
            except TenantError as exc:  # re-sealed and its old version retired since the read
                if attempt == 0 and exc.code == "data_key_retired" and _moved(row):
                    continue
                raise
            break
        sealed.seek(0)
        snapshot_open_stream(sealed, packed, key=key, schema=schema, run_id=row.run_id,
                             visit=row.visit, scope=row.scope)
        packed.seek(0)
        workspace_unpack(packed, path, max_bytes=settings.SANDBOX_WORKSPACE_MAX_BYTES,
                         max_files=settings.SANDBOX_WORKSPACE_MAX_FILES)
    uid = host_uid()
    if uid is not None:
        workspace_chown(path, uid)


def _snapshot_fetch(object_key: str, sink: BinaryIO, *, cap: int) -> str:
    """Download the object into `sink`, refusing more than `cap` bytes; its SHA-256."""
    body = s3_client().get_object(Bucket=settings.S3_BUCKET, Key=object_key)["Body"]
    digest, written = hashlib.sha256(), 0
    for chunk in body.iter_chunks(chunk_size=SNAPSHOT_CHUNK_BYTES):
        written += len(chunk)
        if written > cap:
            raise SandboxError(f"workspace snapshot {object_key} is larger than {cap} bytes")
        digest.update(chunk)
        sink.write(chunk)
    return digest.hexdigest()


def _moved(row: WorkspaceSnapshot) -> bool:
    """Whether the snapshot's row now names another object than `row` did."""
    return not WorkspaceSnapshot.objects.filter(pk=row.pk, object_key=row.object_key,
                                                sha256=row.sha256).exists()


def _superseded_delete(object_key: str) -> None:
    """Delete an object no row names any more; a failure leaves an extra object, logged."""
    try:
        s3_client().delete_object(Bucket=settings.S3_BUCKET, Key=object_key)
    except (BotoCoreError, ClientError) as exc:
        log.warning("superseded workspace snapshot %s was not deleted: %s", object_key, exc)


def _store_unavailable(verb: str, object_key: str, exc: Exception) -> SandboxError:
    """A neutral error for the step (tenants read it); the S3 detail names the internal
    endpoint, so it goes to the operators' log only."""
    log.warning("S3 could not %s workspace snapshot %s: %s", verb, object_key, exc)
    return SandboxError("the workspace store is unavailable; try again later")


def workspace_snapshots_reseal(*, tenant, to_version: int) -> int:
    """Re-seal every workspace snapshot of the current tenant's schema under data key
    `to_version` (a key rotation). Idempotent; returns the snapshots changed.

    The re-sealed object gets a key of its own and the row moves to it in one transaction under
    the row lock; the superseded object is deleted after the commit (no object key is ever
    written twice, so it is nobody's). A crash in between leaves an extra object, never a row
    without its object."""
    version, new_key = data_key_get(tenant=tenant, version=to_version)
    old_keys: dict[int, bytes] = {}
    changed = 0
    pending = WorkspaceSnapshot.objects.exclude(key_version=version).values_list("pk", flat=True)
    for pk in list(pending):
        with transaction.atomic():
            snapshot = WorkspaceSnapshot.objects.select_for_update().filter(pk=pk).first()
            if snapshot is None or snapshot.key_version == version:
                continue  # pruned meanwhile, or re-taken under the new key
            if snapshot.key_version not in old_keys:
                old_keys[snapshot.key_version] = data_key_get(tenant=tenant,
                                                              version=snapshot.key_version)[1]
            superseded = snapshot.object_key
            blob = s3_client().get_object(Bucket=settings.S3_BUCKET, Key=superseded)["Body"].read()
            if hashlib.sha256(blob).hexdigest() != snapshot.sha256:
                raise SandboxError(f"workspace snapshot {superseded} does not match its record: "
                                   "not re-sealed")
            where = {"schema": tenant.schema_name, "run_id": snapshot.run_id,
                     "visit": snapshot.visit, "scope": snapshot.scope}
            resealed = snapshot_seal(snapshot_open(blob, key=old_keys[snapshot.key_version], **where),
                                     key=new_key, **where)
            resealed_key = snapshot_object_key(**where, unique=True)
            s3_client().put_object(Bucket=settings.S3_BUCKET, Key=resealed_key, Body=resealed,
                                   Metadata={"key-version": str(version)})
            WorkspaceSnapshot.objects.filter(pk=pk).update(
                object_key=resealed_key, key_version=version, size_bytes=len(resealed),
                sha256=hashlib.sha256(resealed).hexdigest())
        _superseded_delete(superseded)
        changed += 1
    return changed


# -- egress allow-list ------------------------------------------------------------------------

def egress_allow(*, hosts: list[str]) -> list[EgressRule]:
    """Add `hosts` to the current tenant's egress allow-list (validated first: all or none);
    returns the whole list. Takes effect from the tenant's next sandbox call."""
    rules = [egress_rule_parse(host) for host in hosts]
    for rule in rules:
        SandboxEgressRule.objects.get_or_create(rule=str(rule))
    return egress_rules()


def egress_remove(*, rule: str) -> bool:
    """Take one rule off the current tenant's allow-list (written as it was allowed, or any
    spelling that parses to it); False when the list has no such rule."""
    try:
        text = str(egress_rule_parse(rule))
    except EgressRuleInvalid:
        return False  # no rule that does not parse was ever stored
    deleted, _ = SandboxEgressRule.objects.filter(rule=text).delete()
    return deleted > 0


def egress_clear() -> None:
    """Empty the current tenant's allow-list: its jails are back to no network at all."""
    SandboxEgressRule.objects.all().delete()


# -- what a step sees: ctx.sandbox -----------------------------------------------------------

def _recorded_command(command: str | list[str], files: dict[str, str | bytes] | None) -> dict:
    digest = hashlib.sha256()
    for name in sorted(files or {}):
        content = files[name]
        digest.update(name.encode() + b"\0")
        digest.update(content.encode() if isinstance(content, str) else content)
        digest.update(b"\0")
    return {"command": command, "files": digest.hexdigest() if files else None}


def _result_of(row: SandboxExecution) -> SandboxResult:
    return SandboxResult(
        exit_code=row.exit_code, stdout=row.stdout, stderr=row.stderr, limit=row.limit or None,
        stdout_truncated=row.stdout_truncated, stderr_truncated=row.stderr_truncated,
        changed_files=row.changed_files, deleted_files=row.deleted_files,
        duration_ms=row.duration_ms, cpu_ms=row.cpu_ms, replayed=True,
    )


class SandboxSession:
    """`ctx.sandbox` for one attempt of one step (one visit, or one fan-out branch of it)."""

    def __init__(self, *, run_id: UUID, visit: int, scope: str | None = None,
                 schema: str | None = None):
        self.run_id, self.visit = run_id, visit
        self.scope = scope or str(visit)  # like effects: "7", or "7/b3" in a branch
        # A fan-out branch has a workspace (local copy and snapshots) of its own.
        self.branch_scope = "" if self.scope == str(visit) else self.scope
        self.schema = schema or connection.schema_name
        self.local = LocalWorkspace(schema=self.schema, run_id=run_id, scope=self.branch_scope)
        self._calls = 0
        self._ready = False

    def run(self, command: str | list[str], *, files: dict[str, str | bytes] | None = None,
            timeout: float | None = None, name: str | None = None) -> SandboxResult:
        """Run `command` (a shell string, or argv) jailed in the run's (or its branch's)
        workspace, after writing `files` (relative path -> content) into it. Recorded as
        (run, scope, name); `name` defaults to the call's order in the step (`sandbox-1`, …)."""
        self._calls += 1
        name = name or f"sandbox-{self._calls}"
        recorded = _recorded_command(command, files)
        row = SandboxExecution.objects.filter(run_id=self.run_id, scope=self.scope,
                                              name=name).first()
        if row is not None:
            if row.command != recorded:
                raise SandboxError(
                    f"sandbox call {name!r} at {self.scope} was recorded with another "
                    "command or files; give each distinct call its own name")
            self._ensure_workspace()
            if row.durable or row.id in (self.local.meta() or {}).get("applied", []):
                return _result_of(row)
            row.delete()  # ran by a worker that died before its step's snapshot: run it again
        if timeout is not None and not 0 < timeout <= settings.SANDBOX_TIMEOUT_MAX_SECONDS:
            raise SandboxError(
                f"timeout must be in (0, {settings.SANDBOX_TIMEOUT_MAX_SECONDS}] seconds")
        sandbox_probe()  # fail closed before touching the workspace
        self._ensure_workspace()
        meta = self.local.meta()
        was_dirty = meta["dirty_by"] is not None
        self.local.meta_write(**{**meta, "dirty_by": process_token()})
        egress = EgressPolicy(tenant=self.schema, run=str(self.run_id),
                              rules=tuple(egress_rules()))
        result = sandbox_execute(workspace=self.local.path, command=command, files=files,
                                 limits=Limits.from_settings(timeout=timeout), egress=egress)
        try:
            with transaction.atomic():  # a savepoint: a refused row leaves the step's transaction
                row = SandboxExecution.objects.create(
                    run_id=self.run_id, visit=self.visit, scope=self.scope, name=name,
                    command=recorded, exit_code=result.exit_code, limit=result.limit or "",
                    stdout=result.stdout, stderr=result.stderr,
                    stdout_truncated=result.stdout_truncated,
                    stderr_truncated=result.stderr_truncated,
                    changed_files=result.changed_files, deleted_files=result.deleted_files,
                    duration_ms=result.duration_ms, cpu_ms=result.cpu_ms,
                )
        except DataError as exc:  # the jail's output is sanitized; this is a last resort
            raise SandboxError(f"sandbox call {name!r} ran, but its outcome cannot be "
                               f"recorded: {exc.__class__.__name__}") from exc
        changed = bool(files or result.changed_files or result.deleted_files)
        self.local.meta_write(**{
            **meta, "applied": meta["applied"] + [row.id],
            "dirty_by": process_token() if (was_dirty or changed) else None,
        })
        return result

    def read(self, path: str) -> bytes:
        """A file of the workspace, as the step's commands left it."""
        self._ensure_workspace()
        return workspace_read(self.local.path, path,
                              max_bytes=settings.SANDBOX_WORKSPACE_MAX_BYTES)

    def step_completed(self) -> WorkspaceSnapshot | None:
        """The step returned: snapshot the workspace if it changed, then its calls are durable."""
        if not self._calls:
            return None
        snapshot = None
        meta = self.local.meta()
        if meta is not None and meta["dirty_by"] is not None:
            snapshot = workspace_snapshot(schema=self.schema, run_id=self.run_id, visit=self.visit,
                                          path=self.local.path, scope=self.branch_scope)
            self.local.meta_write(snapshot=snapshot.sha256, dirty_by=None, applied=[])
        SandboxExecution.objects.filter(run_id=self.run_id, scope=self.scope,
                                        durable=False).update(durable=True)
        return snapshot

    def _ensure_workspace(self) -> None:
        """Make the local copy exactly the newest snapshot, unless this process is working in it.
        A branch's newest is its own, else the run's as the steps before its fan-out left it."""
        if self._ready:
            return
        snapshots = WorkspaceSnapshot.objects.filter(run_id=self.run_id).order_by("-visit")
        if self.branch_scope:
            latest = (snapshots.filter(scope=self.branch_scope).first()
                      or snapshots.filter(scope="", visit__lt=self.visit).first())
        else:
            latest = snapshots.filter(scope="").first()
        expected = latest.sha256 if latest else None
        meta = self.local.meta()
        current = (meta is not None and self.local.path.is_dir()
                   and meta.get("snapshot") == expected
                   and meta.get("dirty_by") in (None, process_token()))
        if not current:
            self.local.reset()
            if latest is not None:
                workspace_restore(schema=self.schema, snapshot=latest, path=self.local.path)
            self.local.meta_write(snapshot=expected, dirty_by=None, applied=[])
        self._ready = True

