"""Key material: the master key (from the environment) wraps each tenant's data key.

A data key (256-bit AES) is wrapped with AES-256-GCM under the master key; the associated data
names the tenant (id and schema) and the key version, so a wrapped key copied onto another
tenant's row, or onto another version's, fails authentication there. A wrong master key fails
the same way. Either raises `KeyUnwrapError`, never returns garbage.

Wrapped form (format 2): WRAP_MAGIC || 12-byte nonce || ciphertext+tag (64 bytes in all). The
first format (AES key wrap, RFC 3394, bound to nothing: 40 bytes), which code before the binding
wrote, is still read, so old and new workers run side by side during a deploy; `manage.py
data_keys_rewrap` turns it into format 2 once every process runs this code (decision 0018).
"""

import base64
import hashlib
import hmac
import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.keywrap import InvalidUnwrap, aes_key_unwrap, aes_key_wrap
from django.conf import settings

WRAP_MAGIC = b"APDK2"
NONCE_BYTES = 12
LEGACY_WRAP_BYTES = 40  # RFC 3394 wrap of a 32-byte key


class MasterKeyMissing(RuntimeError):
    pass


class KeyUnwrapError(RuntimeError):
    pass


def master_key() -> bytes:
    encoded = settings.MASTER_KEY
    if not encoded:
        raise MasterKeyMissing("AGENTPLATFORM_MASTER_KEY is not set (base64 of 32 random bytes)")
    try:
        key = base64.b64decode(encoded, validate=True)
    except ValueError as exc:
        raise MasterKeyMissing("AGENTPLATFORM_MASTER_KEY is not valid base64") from exc
    if len(key) != 32:
        raise MasterKeyMissing(f"AGENTPLATFORM_MASTER_KEY must decode to 32 bytes, not {len(key)}")
    return key


def master_key_id(key: bytes) -> str:
    """A public fingerprint of the master key, so a mismatch is named before unwrapping."""
    return hmac.new(key, b"agentplatform master key id", hashlib.sha256).hexdigest()[:16]


def _binding(*, tenant_id: int, schema: str, version: int) -> bytes:
    return f"agentplatform-data-key/2|tenant:{tenant_id}|schema:{schema}|v{version}".encode()


def data_key_wrap(data_key: bytes, *, tenant_id: int, schema: str, version: int,
                  wrapping_key: bytes | None = None) -> bytes:
    nonce = os.urandom(NONCE_BYTES)
    aad = _binding(tenant_id=tenant_id, schema=schema, version=version)
    return WRAP_MAGIC + nonce + AESGCM(wrapping_key or master_key()).encrypt(nonce, data_key, aad)


def data_key_unwrap(wrapped: bytes, *, tenant_id: int, schema: str, version: int,
                    wrapping_key: bytes | None = None) -> bytes:
    wrapped = bytes(wrapped)
    if is_legacy_wrap(wrapped):
        return legacy_data_key_unwrap(wrapped, wrapping_key=wrapping_key or master_key())
    if not wrapped.startswith(WRAP_MAGIC):
        raise KeyUnwrapError(f"data key v{version} of {schema} is in no known wrap format")
    body = wrapped[len(WRAP_MAGIC):]
    aad = _binding(tenant_id=tenant_id, schema=schema, version=version)
    try:
        return AESGCM(wrapping_key or master_key()).decrypt(body[:NONCE_BYTES], body[NONCE_BYTES:], aad)
    except InvalidTag as exc:
        raise KeyUnwrapError(
            f"cannot unwrap data key v{version} of {schema}: it was not wrapped for this tenant "
            "and version, or the master key is not the one it was wrapped with"
        ) from exc


def legacy_data_key_unwrap(wrapped: bytes, *, wrapping_key: bytes) -> bytes:
    """The first wrap format (RFC 3394, unbound), as code before the binding wrote it."""
    try:
        return aes_key_unwrap(wrapping_key, bytes(wrapped))
    except InvalidUnwrap as exc:
        raise KeyUnwrapError(
            "cannot unwrap a legacy data key: the master key is not the one it was wrapped with"
        ) from exc


def legacy_data_key_wrap(data_key: bytes, *, wrapping_key: bytes) -> bytes:
    """The first wrap format again: only for rolling code back (`data_keys_rewrap --to-legacy`)."""
    return aes_key_wrap(wrapping_key, data_key)


def is_legacy_wrap(wrapped: bytes) -> bool:
    wrapped = bytes(wrapped)
    return len(wrapped) == LEGACY_WRAP_BYTES and not wrapped.startswith(WRAP_MAGIC)


def data_key_new() -> bytes:
    return os.urandom(32)
