"""Per-tenant data keys, wrapped by the master key and bound to their tenant and version."""

import base64
import io
import os

import pytest
from cryptography.hazmat.primitives.keywrap import aes_key_wrap
from django.core.management import call_command

from tenants import keys
from tenants.models import TenantKey
from tenants.services import data_key_get


def unwrap(row):
    return keys.data_key_unwrap(row.wrapped_key, tenant_id=row.tenant_id,
                                schema=row.tenant.schema_name, version=row.version)


def test_data_key_round_trips_and_is_stored_only_wrapped(acme):
    version, key = data_key_get(tenant=acme)
    assert version == 1 and len(key) == 32
    row = acme.data_keys.get(version=1)
    assert key not in bytes(row.wrapped_key)
    assert unwrap(row) == key
    assert data_key_get(tenant=acme, version=1) == (1, key)


def test_tenants_have_different_data_keys(acme, globex):
    assert data_key_get(tenant=acme)[1] != data_key_get(tenant=globex)[1]


def test_wrong_master_key_fails_loudly(acme, settings):
    row = acme.data_keys.get(version=1)
    settings.MASTER_KEY = base64.b64encode(os.urandom(32)).decode()
    with pytest.raises(keys.KeyUnwrapError, match="wrapped by master key"):
        data_key_get(tenant=acme)
    with pytest.raises(keys.KeyUnwrapError, match="not the one it was wrapped with"):
        unwrap(row)


@pytest.mark.parametrize("value", ["", "not base64!", base64.b64encode(b"short").decode()])
def test_missing_or_malformed_master_key_is_named(settings, value):
    settings.MASTER_KEY = value
    with pytest.raises(keys.MasterKeyMissing, match="AGENTPLATFORM_MASTER_KEY"):
        keys.master_key()


def test_a_wrapped_key_copied_onto_another_tenants_row_does_not_open(acme, globex):
    acme_row, globex_row = acme.data_keys.get(version=1), globex.data_keys.get(version=1)
    original = bytes(globex_row.wrapped_key)
    TenantKey.objects.filter(pk=globex_row.pk).update(wrapped_key=bytes(acme_row.wrapped_key))
    try:
        with pytest.raises(keys.KeyUnwrapError, match="not wrapped for this tenant"):
            data_key_get(tenant=globex)
    finally:
        TenantKey.objects.filter(pk=globex_row.pk).update(wrapped_key=original)
    assert data_key_get(tenant=globex)[1] != data_key_get(tenant=acme)[1]


def test_a_wrapped_key_does_not_open_as_another_version_of_the_same_tenant(acme):
    row = acme.data_keys.get(version=1)
    with pytest.raises(keys.KeyUnwrapError):
        keys.data_key_unwrap(row.wrapped_key, tenant_id=acme.pk, schema="acme", version=2)


def rewrap(*args) -> str:
    out = io.StringIO()
    call_command("data_keys_rewrap", *args, stdout=out)
    return out.getvalue()


def test_a_first_format_key_still_opens_in_its_own_tenant(globex):
    """Workers of the code before the binding wrote the first format; during a rolling deploy
    and until `data_keys_rewrap` runs, their keys must keep opening."""
    row = globex.data_keys.get(version=1)
    original = bytes(row.wrapped_key)
    _, data_key = data_key_get(tenant=globex)
    legacy = aes_key_wrap(keys.master_key(), data_key)  # how the code before wrapped keys
    TenantKey.objects.filter(pk=row.pk).update(wrapped_key=legacy)
    try:
        assert data_key_get(tenant=globex) == (1, data_key)
    finally:
        TenantKey.objects.filter(pk=row.pk).update(wrapped_key=original)


def test_data_keys_rewrap_binds_first_format_keys_to_their_tenant_and_is_idempotent(acme, globex):
    row = globex.data_keys.get(version=1)
    acme_row = acme.data_keys.get(version=1)
    original, acme_original = bytes(row.wrapped_key), bytes(acme_row.wrapped_key)
    _, data_key = data_key_get(tenant=globex)
    legacy = aes_key_wrap(keys.master_key(), data_key)
    TenantKey.objects.filter(pk=row.pk).update(wrapped_key=legacy)
    try:
        assert "1 data key(s) re-wrapped" in rewrap()
        rewrapped = bytes(TenantKey.objects.get(pk=row.pk).wrapped_key)
        assert rewrapped.startswith(keys.WRAP_MAGIC) and rewrapped != legacy
        assert data_key_get(tenant=globex) == (1, data_key)
        assert "0 data key(s) re-wrapped" in rewrap()  # idempotent: nothing legacy is left
        assert bytes(TenantKey.objects.get(pk=row.pk).wrapped_key) == rewrapped

        TenantKey.objects.filter(pk=acme_row.pk).update(wrapped_key=rewrapped)  # copied to acme
        with pytest.raises(keys.KeyUnwrapError):
            data_key_get(tenant=acme)
    finally:
        TenantKey.objects.filter(pk=row.pk).update(wrapped_key=original)
        TenantKey.objects.filter(pk=acme_row.pk).update(wrapped_key=acme_original)


def test_data_keys_rewrap_to_legacy_rolls_the_wrap_back_for_older_code(globex):
    row = globex.data_keys.get(version=1)
    original = bytes(row.wrapped_key)
    _, data_key = data_key_get(tenant=globex)
    try:
        rewrap("--to-legacy")
        legacy = bytes(TenantKey.objects.get(pk=row.pk).wrapped_key)
        assert keys.is_legacy_wrap(legacy)
        assert keys.legacy_data_key_unwrap(legacy, wrapping_key=keys.master_key()) == data_key
    finally:
        rewrap()
        TenantKey.objects.filter(pk=row.pk).update(wrapped_key=original)
