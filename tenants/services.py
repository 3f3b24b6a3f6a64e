"""Tenant verbs: provision, suspend, reactivate, delete; API keys; data keys; the console's
access log."""

import functools
import hashlib
import hmac
import logging
import re
import secrets
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from uuid import UUID

from botocore.exceptions import BotoCoreError, ClientError
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone
from django_tenants.utils import get_public_schema_name

from agentplatform.direct_connection import direct_connect
from agentplatform.errors import ServiceError
from agentplatform.prepared import prepared_row
from agentplatform.s3 import s3_client
from agentplatform.trees import tree_remove

from . import keys
from .models import ApiKey, ConsoleAccess, Scope, Tenant, TenantKey, scopes_all

log = logging.getLogger(__name__)

SCHEMA_NAME = re.compile(r"^[a-z][a-z0-9_]{0,39}$")
RESERVED_SCHEMAS = {"public", "information_schema"}
API_KEY = re.compile(r"^ap_([a-z0-9]{12})_([A-Za-z0-9_-]{43})$")
LAST_USED_RESOLUTION = timedelta(minutes=1)


class TenantError(ServiceError):
    """A tenant operation that cannot be done, with a message meant for a person."""

    def __init__(self, message: str, *, code: str = "tenant_error"):
        super().__init__(code, message)


@dataclass(frozen=True)
class Provisioned:
    tenant: Tenant
    created: bool
    api_key: str | None  # the plaintext, only when just created: shown once


def schema_name_check(name: str) -> None:
    if not SCHEMA_NAME.match(name) or name in RESERVED_SCHEMAS or name.startswith("pg_"):
        raise TenantError(
            f"{name!r} is not a valid tenant name: use 1-40 lowercase letters, digits or "
            "underscores, starting with a letter (not 'public' and not starting with 'pg_')"
        )


def tenant_create(*, schema_name: str, name: str = "") -> Provisioned:
    """Create the schema, migrate it, make a data key and a first API key. Idempotent."""
    schema_name_check(schema_name)
    existing = Tenant.objects.filter(schema_name=schema_name).first()
    if existing is not None and existing.provisioned_at is not None:
        return Provisioned(tenant=existing, created=False, api_key=None)
    with transaction.atomic():
        tenant = existing or Tenant.objects.create(schema_name=schema_name, name=name or schema_name)
        if not tenant.data_keys.exists():
            data_key_create(tenant=tenant)
        plaintext = None if tenant.api_keys.exists() else api_key_create(tenant=tenant)[1]
    # A schema left half-migrated by an earlier crash is dropped and made again.
    tenant._drop_schema(force_drop=True)
    tenant.create_schema(verbosity=0)
    Tenant.objects.filter(pk=tenant.pk).update(provisioned_at=timezone.now())
    if plaintext is None:  # the first key was made by the crashed attempt and never shown
        ApiKey.objects.filter(tenant=tenant).update(revoked_at=timezone.now())
        plaintext = api_key_create(tenant=tenant)[1]
    tenant.refresh_from_db()
    return Provisioned(tenant=tenant, created=True, api_key=plaintext)


def tenant_suspend(*, tenant: Tenant) -> None:
    """API keys stop working. A tenant being deleted stays `deleting`."""
    Tenant.objects.filter(pk=tenant.pk).exclude(status=Tenant.Status.DELETING).update(
        status=Tenant.Status.SUSPENDED)
    tenant.refresh_from_db(fields=["status"])


def tenant_reactivate(*, tenant: Tenant) -> None:
    """API keys work again; refused for a tenant whose deletion has begun (its objects may be
    gone already): run `delete_tenant` again to finish it."""
    updated = Tenant.objects.filter(pk=tenant.pk).exclude(status=Tenant.Status.DELETING).update(
        status=Tenant.Status.ACTIVE)
    if not updated:
        raise TenantError(f"tenant {tenant.schema_name} is being deleted and cannot be "
                          "reactivated: run `manage.py delete_tenant` again to finish",
                          code="tenant_deleting")
    tenant.status = Tenant.Status.ACTIVE


def tenant_object_prefixes(*, schema: str) -> list[str]:
    """Where the tenant's objects live in S3_BUCKET: archives under RETENTION_S3_PREFIX,
    workspace snapshots under tenants/ (sandboxes.services.snapshot_object_key)."""
    return sorted({f"{settings.RETENTION_S3_PREFIX}/{schema}/", f"tenants/{schema}/"})


def tenant_objects_delete(*, schema: str) -> int:
    """Delete every S3 object under the tenant's prefixes; returns how many were deleted."""
    client = s3_client()
    deleted = 0
    try:
        for prefix in tenant_object_prefixes(schema=schema):
            for page in client.get_paginator("list_objects_v2").paginate(
                    Bucket=settings.S3_BUCKET, Prefix=prefix):
                keys = [{"Key": item["Key"]} for item in page.get("Contents", [])]
                if not keys:
                    continue
                answer = client.delete_objects(Bucket=settings.S3_BUCKET,
                                               Delete={"Objects": keys, "Quiet": True})
                if answer.get("Errors"):
                    raise TenantError(f"S3 refused to delete {len(answer['Errors'])} object(s) of "
                                      f"{schema}; nothing else was deleted: run it again",
                                      code="tenant_storage_unavailable")
                deleted += len(keys)
    except (BotoCoreError, ClientError) as exc:
        raise TenantError(f"S3 is unavailable, so the objects of {schema} stay and so does the "
                          f"tenant: run it again ({type(exc).__name__})",
                          code="tenant_storage_unavailable") from exc
    return deleted


def tenant_workspaces_delete(*, schema: str) -> bool:
    """Remove this host's working copies of the tenant's workspaces; False if there were none."""
    root = Path(settings.SANDBOX_WORKSPACE_ROOT) / schema
    if not root.exists():
        return False
    tree_remove(root)  # iterative and fd-relative: a jail may have nested thousands deep
    return True


def tenant_delete(*, tenant: Tenant) -> None:
    """Delete the tenant: its S3 objects (archives, workspace snapshots), this host's workspace
    copies, its schema and every public row that belongs to it. Irreversible.

    The tenant is marked `deleting` first (its API keys stop working, and it can never be
    reactivated half-deleted); the schema and its public rows go in one transaction, so no crash
    leaves the ready list or a wakeup naming a schema that is gone. A deletion stopped by an
    unreachable S3 leaves a `deleting` tenant to delete again."""
    if tenant.schema_name == get_public_schema_name():
        raise TenantError("the public schema is not a tenant")
    schema = tenant.schema_name
    connection.set_schema_to_public()
    Tenant.objects.filter(pk=tenant.pk).update(status=Tenant.Status.DELETING)
    tenant.status = Tenant.Status.DELETING
    tenant_objects_delete(schema=schema)
    tenant_workspaces_delete(schema=schema)
    with transaction.atomic():  # DROP SCHEMA is transactional: schema and rows go together
        tenant.delete(force_drop=True)  # cascades to keys, domains, connections, ready list, wakeups
    # A worker that was mid-step may have written a snapshot or a local copy since: with the
    # schema gone, no run of the tenant can write another.
    tenant_workspaces_delete(schema=schema)
    try:
        tenant_objects_delete(schema=schema)
    except TenantError as exc:
        log.warning("tenant %s deleted, but objects written during the deletion may remain: %s",
                    schema, exc)


def console_access_record(*, user, tenant: Tenant, view: str, path: str,
                          run_ids: list[UUID | None] | None = None) -> None:
    """Write the audit rows of one look into a tenant's runs (one per run it names)."""
    ConsoleAccess.objects.bulk_create([
        ConsoleAccess(user_id=user.pk, username=user.get_username(), tenant_schema=tenant.schema_name,
                      view=view[:40], run_id=run_id, path=path[:500])
        for run_id in (run_ids or [None])
    ])


def api_key_create(*, tenant: Tenant, name: str = "default",
                   scopes: Iterable[str] | None = None) -> tuple[ApiKey, str]:
    """Return the new key row and its plaintext, which is never stored and shown only once.
    `scopes`: what the key may do (docs/api.md); None: every scope, as keys had before scopes."""
    granted = scopes_check(scopes) if scopes is not None else scopes_all()
    prefix = "".join(secrets.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(12))
    plaintext = f"ap_{prefix}_{secrets.token_urlsafe(32)}"
    key = ApiKey.objects.create(tenant=tenant, name=name, prefix=prefix, key_hash=_digest(plaintext),
                                scopes=granted)
    return key, plaintext


def scopes_check(scopes: Iterable[str]) -> list[str]:
    """The scopes asked for, each known and once, in the vocabulary's order; at least one."""
    asked = {scope.strip() for scope in scopes if scope.strip()}
    unknown = asked - set(Scope.values)
    if unknown:
        raise TenantError(f"unknown scope(s) {', '.join(sorted(unknown))}; known: "
                          f"{', '.join(Scope.values)}", code="unknown_scope")
    if not asked:
        raise TenantError("a key needs at least one scope", code="unknown_scope")
    return [scope for scope in Scope.values if scope in asked]


def api_key_revoke(*, key: ApiKey) -> None:
    ApiKey.objects.filter(pk=key.pk, revoked_at=None).update(revoked_at=timezone.now())


class ApiKeyRejected(ServiceError):
    """A presented API key that selects no tenant (the API answers 401, or 403 if suspended)."""


def api_key_authenticate(*, presented: str) -> ApiKey:
    """Find the tenant a presented key belongs to, or raise `ApiKeyRejected`."""
    match = API_KEY.match(presented)
    if not match:
        raise ApiKeyRejected("invalid_api_key", "The API key is malformed.")
    key = _api_key_with_tenant(prefix=match.group(1))
    # Compare digests in constant time; an unknown prefix still pays for one comparison.
    expected = key.key_hash if key else "0" * 64
    if not hmac.compare_digest(expected, _digest(presented)) or key is None:
        raise ApiKeyRejected("invalid_api_key", "The API key is not valid.")
    if key.revoked_at is not None:
        raise ApiKeyRejected("api_key_revoked", "The API key has been revoked.")
    if not key.tenant.is_active:
        raise ApiKeyRejected("tenant_suspended", "The tenant is suspended.")
    now = timezone.now()
    if key.last_used_at is None or now - key.last_used_at > LAST_USED_RESOLUTION:
        ApiKey.objects.filter(pk=key.pk).update(last_used_at=now)
        key.last_used_at = now
    return key


# The key's fields, then its tenant's, in their models' order: what `from_db` takes.
API_KEY_FIELDS = [field.attname for field in ApiKey._meta.concrete_fields]
TENANT_FIELDS = [field.attname for field in Tenant._meta.concrete_fields]


def _api_key_with_tenant(*, prefix: str) -> ApiKey | None:
    """The key with this prefix, its tenant loaded, or None. Every API request reads it: one
    prepared statement, about 0.1 ms of CPU where the ORM's query took 0.6 ms (building the
    query, most of it). Read at each request, never cached: a revoked key or a suspended
    tenant is refused at once."""
    row = prepared_row(_api_key_sql(), [prefix])
    if row is None:
        return None
    key = ApiKey.from_db(connection.alias, API_KEY_FIELDS, row[:len(API_KEY_FIELDS)])
    key.tenant = Tenant.from_db(connection.alias, TENANT_FIELDS, row[len(API_KEY_FIELDS):])
    return key


@functools.cache
def _api_key_sql() -> str:
    key, tenant, public = ApiKey._meta, Tenant._meta, get_public_schema_name()
    columns = [f"k.{field.column}" for field in key.concrete_fields]
    columns += [f"t.{field.column}" for field in tenant.concrete_fields]
    return f"""SELECT {", ".join(columns)}
                 FROM "{public}".{key.db_table} k JOIN "{public}".{tenant.db_table} t ON t.id = k.tenant_id
                WHERE k.prefix = %s"""


def data_key_create(*, tenant: Tenant) -> TenantKey:
    master = keys.master_key()
    version = (tenant.data_keys.order_by("-version").values_list("version", flat=True).first() or 0) + 1
    return TenantKey.objects.create(
        tenant=tenant,
        version=version,
        wrapped_key=keys.data_key_wrap(keys.data_key_new(), tenant_id=tenant.pk,
                                       schema=tenant.schema_name, version=version,
                                       wrapping_key=master),
        master_key_id=keys.master_key_id(master),
    )


def data_key_get(*, tenant: Tenant, version: int | None = None) -> tuple[int, bytes]:
    """The tenant's data key (the newest active one unless a version is asked for), unwrapped,
    to open something. A retired version opens nothing: everything it sealed was re-sealed before
    it was retired. To seal, use `data_key_for_write`."""
    rows = tenant.data_keys.order_by("-version")
    row = rows.filter(version=version).first() if version else rows.filter(retired_at=None).first()
    if row is None:
        raise TenantError(f"tenant {tenant.schema_name} has no data key version {version or 'active'}",
                          code="data_key_missing")
    if row.retired_at is not None:
        raise TenantError(f"data key v{row.version} of {tenant.schema_name} is retired",
                          code="data_key_retired")
    return row.version, _data_key_unwrap(tenant=tenant, row=row)


def data_key_for_write(*, tenant: Tenant) -> tuple[int, bytes]:
    """The newest active data key, to seal something that the caller stores in the transaction
    it is in. The key's row is held FOR SHARE until that transaction ends, and retiring a version
    takes its row FOR UPDATE before counting what is sealed under it (data_key_retire): so a
    retirement waits for this write and then sees it, and nothing is stored under a retired key."""
    if not connection.in_atomic_block:
        raise RuntimeError("data_key_for_write must run inside the transaction that stores what "
                           "it seals")
    table = connection.ops.quote_name(TenantKey._meta.db_table)
    for _ in range(3):
        with connection.cursor() as cursor:
            # Waits while a retirement holds the newest row; if it retired it, the row no longer
            # qualifies and the next attempt (a new snapshot) finds the version after it.
            cursor.execute(f"SELECT id FROM {table} WHERE tenant_id = %s AND retired_at IS NULL "
                           "ORDER BY version DESC LIMIT 1 FOR SHARE", [tenant.pk])
            found = cursor.fetchone()
        if found is not None:
            row = TenantKey.objects.get(pk=found[0])
            return row.version, _data_key_unwrap(tenant=tenant, row=row)
    raise TenantError(f"tenant {tenant.schema_name} has no active data key", code="data_key_missing")


@contextmanager
def data_key_rotation_lock(*, tenant: Tenant) -> Iterator[None]:
    """Held by one rotation of the tenant's data key at a time (a session advisory lock: a
    rotation spans many transactions), so two cannot retire each other's new version. On a
    connection of its own to PostgreSQL itself, never a transaction pool; closing it unlocks."""
    name = f"agentplatform.data-key-rotation:{tenant.pk}"
    with direct_connect(application_name="agentplatform-data-key-rotation") as lock:
        if not lock.execute("SELECT pg_try_advisory_lock(hashtextextended(%s, 0))",
                            [name]).fetchone()[0]:
            raise TenantError(f"a rotation of the data key of {tenant.schema_name} is already "
                              "running; run it again when that one has finished",
                              code="data_key_rotation_running")
        yield


def _data_key_unwrap(*, tenant: Tenant, row: TenantKey) -> bytes:
    master = keys.master_key()
    if not hmac.compare_digest(row.master_key_id, keys.master_key_id(master)):
        raise keys.KeyUnwrapError(
            f"data key v{row.version} of {tenant.schema_name} was wrapped by master key "
            f"{row.master_key_id}, not by the configured one"
        )
    return keys.data_key_unwrap(row.wrapped_key, tenant_id=tenant.pk, schema=tenant.schema_name,
                                version=row.version, wrapping_key=master)


def data_keys_rewrap(*, to_legacy: bool = False) -> int:
    """Re-wrap every data key still in the first (unbound) wrap format in the tenant-bound one;
    run once every process runs code that reads both (docs/operators.md). Idempotent; returns
    the keys re-wrapped. `to_legacy` does the reverse, only to roll code back past the binding.
    The data keys themselves do not change, so nothing sealed under them needs re-sealing."""
    master = keys.master_key()
    changed = 0
    for pk in list(TenantKey.objects.order_by("pk").values_list("pk", flat=True)):
        with transaction.atomic():
            row = TenantKey.objects.select_for_update(of=("self",)).select_related("tenant").get(pk=pk)
            if keys.is_legacy_wrap(row.wrapped_key) != to_legacy:
                data_key = _data_key_unwrap(tenant=row.tenant, row=row)
                row.wrapped_key = (
                    keys.legacy_data_key_wrap(data_key, wrapping_key=master) if to_legacy else
                    keys.data_key_wrap(data_key, tenant_id=row.tenant_id,
                                       schema=row.tenant.schema_name, version=row.version,
                                       wrapping_key=master))
                row.save(update_fields=["wrapped_key"])
                changed += 1
    return changed


def _digest(plaintext: str) -> str:
    # API keys carry 256 random bits, so a fast hash is as strong as a slow one here.
    return hashlib.sha256(plaintext.encode()).hexdigest()
