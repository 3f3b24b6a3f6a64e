"""Credential verbs: set, get (decrypted), delete, always in the current tenant's schema.

Secrets are a JSON object sealed with AES-256-GCM under the tenant's data key, with a random
nonce; the associated data names the schema, connector, label and key version, so a row copied
to another tenant, connector or label fails to open instead of handing out someone's token.
"""

import json
import os
import re
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from django.db import connection, transaction
from django_tenants.utils import get_public_schema_name

from agentplatform.errors import ServiceError
from tenants.models import Tenant
from tenants.services import data_key_for_write, data_key_get

from .connectors import connector_get
from .models import Credential

NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,49}$")
LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
SECRETS_MAX_BYTES = 16 * 1024
NONCE_BYTES = 12


class CredentialError(ServiceError):
    """A credential that cannot be stored or opened; `code` is stable, the message for a person."""

    code = "credential_error"

    def __init__(self, message: str, *, code: str | None = None):
        super().__init__(code or self.code, message)


class CredentialNotFound(CredentialError, LookupError):
    code = "not_found"


def credential_set(*, connector: str, secrets: dict[str, Any], label: str = "default") -> Credential:
    """Store (or replace) the secrets for `connector`/`label`, sealed with the newest data key."""
    _check_names(connector, label)
    if not isinstance(secrets, dict) or not secrets:
        raise CredentialError("secrets must be a non-empty JSON object", code="invalid_secrets")
    problem = _shape_problem(connector, secrets)
    if problem:
        raise CredentialError(f"not a valid {connector!r} credential: {problem}",
                              code="invalid_secrets")
    plaintext = json.dumps(secrets, separators=(",", ":"), sort_keys=True).encode()
    if len(plaintext) > SECRETS_MAX_BYTES:
        raise CredentialError(f"secrets are larger than {SECRETS_MAX_BYTES} bytes", code="invalid_secrets")
    tenant = _current_tenant()
    with transaction.atomic():
        # Held FOR SHARE until the row commits: a retirement of the version waits and sees it.
        version, key = data_key_for_write(tenant=tenant)
        nonce = os.urandom(NONCE_BYTES)
        sealed = nonce + AESGCM(key).encrypt(
            nonce, plaintext, _associated_data(tenant.schema_name, connector, label, version))
        credential, _ = Credential.objects.update_or_create(
            connector=connector, label=label, defaults={"ciphertext": sealed, "key_version": version})
    return credential


def credential_get(*, connector: str, label: str = "default", missing_ok: bool = False) -> dict[str, Any]:
    """The decrypted secrets; `{}` when there are none and `missing_ok`, else CredentialNotFound."""
    credential = Credential.objects.filter(connector=connector, label=label).first()
    if credential is None:
        if missing_ok:
            return {}
        raise CredentialNotFound(f"no {connector!r} credential labelled {label!r} for this tenant")
    return credential_open(credential=credential)


def credential_open(*, credential: Credential) -> dict[str, Any]:
    tenant = _current_tenant()
    version, key = data_key_get(tenant=tenant, version=credential.key_version)
    sealed = bytes(credential.ciphertext)
    aad = _associated_data(tenant.schema_name, credential.connector, credential.label, version)
    try:
        plaintext = AESGCM(key).decrypt(sealed[:NONCE_BYTES], sealed[NONCE_BYTES:], aad)
    except InvalidTag:
        raise CredentialError(
            f"cannot decrypt the {credential.connector}/{credential.label} credential in tenant "
            f"{tenant.schema_name}: it was not sealed for this tenant, connector and label with "
            f"data key v{version}", code="credential_undecryptable") from None
    return json.loads(plaintext)


def credentials_reseal(*, tenant: Tenant, to_version: int) -> int:
    """Re-seal every credential of the current tenant's schema under data key `to_version` (a key
    rotation). Idempotent; returns the credentials changed."""
    version, new_key = data_key_get(tenant=tenant, version=to_version)
    changed = 0
    for pk in list(Credential.objects.exclude(key_version=version).values_list("pk", flat=True)):
        with transaction.atomic():
            credential = Credential.objects.select_for_update().filter(pk=pk).first()
            if credential is None or credential.key_version == version:
                continue
            plaintext = json.dumps(credential_open(credential=credential), separators=(",", ":"),
                                   sort_keys=True).encode()
            nonce = os.urandom(NONCE_BYTES)
            sealed = nonce + AESGCM(new_key).encrypt(nonce, plaintext, _associated_data(
                tenant.schema_name, credential.connector, credential.label, version))
            Credential.objects.filter(pk=pk).update(ciphertext=sealed, key_version=version)
            changed += 1
    return changed


def credential_delete(*, connector: str, label: str = "default") -> bool:
    """Remove the credential; False when there was none."""
    deleted, _ = Credential.objects.filter(connector=connector, label=label).delete()
    return deleted > 0


def _current_tenant() -> Tenant:
    schema = connection.schema_name
    if schema == get_public_schema_name():
        raise CredentialError("credentials live in a tenant's schema; no tenant is selected",
                              code="no_tenant")
    tenant = getattr(connection, "tenant", None)
    if isinstance(tenant, Tenant) and tenant.schema_name == schema:
        return tenant
    return Tenant.objects.get(schema_name=schema)  # set_schema() leaves only a FakeTenant


def _shape_problem(connector: str, secrets: dict[str, Any]) -> str:
    """The connector's own check of its credential's fields; a connector that is not registered
    (yet) has none."""
    try:
        receiver = connector_get(connector)
    except LookupError:
        return ""
    return receiver.credential_problem(secrets)


def _check_names(connector: str, label: str) -> None:
    if not NAME.fullmatch(connector or ""):  # fullmatch: `$` alone lets a trailing newline by
        raise CredentialError(f"{connector!r} is not a connector name", code="invalid_connector")
    credential_label_check(label)


def credential_label_check(label: str) -> None:
    """Raises invalid_label unless `label` is one a credential may have."""
    if not LABEL.fullmatch(label or ""):
        raise CredentialError(
            f"{label!r} is not a valid label: 1-100 letters, digits, '.', '_' or '-'",
            code="invalid_label")


def _associated_data(schema: str, connector: str, label: str, version: int) -> bytes:
    return "\x00".join(["agentplatform-credential/1", schema, connector, label, str(version)]).encode()
