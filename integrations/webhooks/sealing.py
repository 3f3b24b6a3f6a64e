"""Secrets at rest under the tenant's data key: AES-256-GCM, bound to what they belong to.

Sealed form: 12-byte nonce || ciphertext+tag. The associated data names the owner (e.g. the
Slack connection), so a sealed secret copied onto another row does not open there.
"""

import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from tenants.models import Tenant
from tenants.services import data_key_for_write, data_key_get


class SecretUnreadable(RuntimeError):
    pass


def secret_seal(*, tenant: Tenant, plaintext: str, bound_to: str,
                version: int | None = None) -> tuple[bytes, int]:
    """Returns (sealed bytes, data key version): the newest active one unless `version` is given.
    The newest is held FOR SHARE (`data_key_for_write`): store the sealed secret in the caller's
    transaction, so a retirement of that version waits for it and sees it."""
    version, key = (data_key_get(tenant=tenant, version=version) if version is not None
                    else data_key_for_write(tenant=tenant))
    nonce = os.urandom(12)
    return nonce + AESGCM(key).encrypt(nonce, plaintext.encode(), bound_to.encode()), version


def secret_open(*, tenant: Tenant, sealed: bytes, version: int, bound_to: str) -> str:
    _, key = data_key_get(tenant=tenant, version=version)
    sealed = bytes(sealed)
    try:
        return AESGCM(key).decrypt(sealed[:12], sealed[12:], bound_to.encode()).decode()
    except InvalidTag as exc:
        raise SecretUnreadable(f"sealed secret bound to {bound_to} does not open") from exc
