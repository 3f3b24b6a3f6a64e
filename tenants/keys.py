"""Key material: the master key (from the environment) wraps each tenant's data key.

Data keys are 256-bit AES keys wrapped with AES key wrap (RFC 3394); a wrong master key fails
the integrity check of the unwrap and raises `KeyUnwrapError`, never returns garbage.
"""

import base64
import hashlib
import hmac
import os

from cryptography.hazmat.primitives.keywrap import InvalidUnwrap, aes_key_unwrap, aes_key_wrap
from django.conf import settings


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


def data_key_wrap(data_key: bytes, *, wrapping_key: bytes | None = None) -> bytes:
    return aes_key_wrap(wrapping_key or master_key(), data_key)


def data_key_unwrap(wrapped: bytes, *, wrapping_key: bytes | None = None) -> bytes:
    try:
        return aes_key_unwrap(wrapping_key or master_key(), bytes(wrapped))
    except InvalidUnwrap as exc:
        raise KeyUnwrapError(
            "cannot unwrap the data key: the master key is not the one it was wrapped with"
        ) from exc


def data_key_new() -> bytes:
    return os.urandom(32)
