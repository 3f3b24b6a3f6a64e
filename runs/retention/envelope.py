"""Archive envelopes: an object body sealed with AES-256-GCM under its own fresh key, and that
key wrapped (AES-256-GCM as well) by the tenant's data key.

Object layout: MAGIC, a one-line JSON header {tenant, run, key_version}, a 12-byte nonce, the
ciphertext with its tag. The header is the body's associated data, so a body moved to another
tenant or run, or a changed header, fails authentication. The wrapped object key binds tenant,
run and the wrapping key version the same way; re-wrapping it (key rotation) leaves the object,
and its sha256, untouched.
"""

import json
import os
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from agentplatform.errors import ServiceError

MAGIC = b"agentplatform-archive/1\n"
NONCE_BYTES = 12


class ArchiveError(ServiceError):
    """An archive that cannot be written or read; `code` is stable, the message is for a person.
    Each subclass names its code."""

    code = "archive_error"

    def __init__(self, message: str):
        super().__init__(self.code, message)


class ArchiveCorrupt(ArchiveError):
    code = "archive_corrupt"


class ArchiveKeyMismatch(ArchiveError):
    code = "archive_key_mismatch"


@dataclass(frozen=True)
class Sealed:
    blob: bytes
    object_key: bytes


def _header(*, tenant: str, run_id: str, key_version: int) -> bytes:
    return json.dumps({"tenant": tenant, "run": run_id, "key_version": key_version},
                      sort_keys=True, separators=(",", ":")).encode()


def seal(body: bytes, *, tenant: str, run_id: str, key_version: int) -> Sealed:
    object_key = AESGCM.generate_key(bit_length=256)
    header = _header(tenant=tenant, run_id=run_id, key_version=key_version)
    nonce = os.urandom(NONCE_BYTES)
    ciphertext = AESGCM(object_key).encrypt(nonce, body, header)
    return Sealed(MAGIC + header + b"\n" + nonce + ciphertext, object_key)


def unseal(blob: bytes, *, object_key: bytes, tenant: str, run_id: str, key_version: int) -> bytes:
    """The body, or ArchiveCorrupt / ArchiveKeyMismatch saying what is wrong."""
    where = f"archive of run {run_id} (tenant {tenant})"
    if not blob.startswith(MAGIC):
        raise ArchiveCorrupt(f"{where}: not an archive object (bad magic bytes)")
    header, newline, rest = blob[len(MAGIC):].partition(b"\n")
    try:
        found = json.loads(header) if newline else None
    except ValueError:
        found = None
    if not isinstance(found, dict):
        raise ArchiveCorrupt(f"{where}: the object's header is unreadable (truncated or altered)")
    expected = {"tenant": tenant, "run": run_id, "key_version": key_version}
    if found != expected:
        raise ArchiveKeyMismatch(f"{where}: the object says it belongs to tenant "
                                 f"{found.get('tenant')!r}, run {found.get('run')!r}, key "
                                 f"v{found.get('key_version')}; expected {expected}")
    if len(rest) < NONCE_BYTES + 16:
        raise ArchiveCorrupt(f"{where}: the object is truncated")
    try:
        return AESGCM(object_key).decrypt(rest[:NONCE_BYTES], rest[NONCE_BYTES:], header)
    except InvalidTag:
        raise ArchiveCorrupt(f"{where}: the body fails authentication: the object was altered "
                             "or truncated") from None


def _wrap_aad(*, tenant: str, run_id: str, key_version: int) -> bytes:
    return f"agentplatform-archive-key|{tenant}|{run_id}|v{key_version}".encode()


def key_wrap(object_key: bytes, *, tenant_key: bytes, tenant: str, run_id: str,
             key_version: int) -> bytes:
    nonce = os.urandom(NONCE_BYTES)
    aad = _wrap_aad(tenant=tenant, run_id=run_id, key_version=key_version)
    return nonce + AESGCM(tenant_key).encrypt(nonce, object_key, aad)


def key_unwrap(wrapped: bytes, *, tenant_key: bytes, tenant: str, run_id: str,
               key_version: int) -> bytes:
    wrapped = bytes(wrapped)
    aad = _wrap_aad(tenant=tenant, run_id=run_id, key_version=key_version)
    try:
        return AESGCM(tenant_key).decrypt(wrapped[:NONCE_BYTES], wrapped[NONCE_BYTES:], aad)
    except InvalidTag:
        raise ArchiveKeyMismatch(
            f"archive of run {run_id}: data key v{key_version} of tenant {tenant} cannot open its "
            "object key (another tenant's key, another key version, or an altered row)"
        ) from None
