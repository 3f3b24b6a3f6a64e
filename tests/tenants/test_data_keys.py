"""Per-tenant data keys, wrapped by the master key."""

import base64
import os

import pytest

from tenants import keys
from tenants.services import data_key_get


def test_data_key_round_trips_and_is_stored_only_wrapped(acme):
    version, key = data_key_get(tenant=acme)
    assert version == 1 and len(key) == 32
    row = acme.data_keys.get(version=1)
    assert key not in bytes(row.wrapped_key)
    assert keys.data_key_unwrap(row.wrapped_key) == key
    assert data_key_get(tenant=acme, version=1) == (1, key)


def test_tenants_have_different_data_keys(acme, globex):
    assert data_key_get(tenant=acme)[1] != data_key_get(tenant=globex)[1]


def test_wrong_master_key_fails_loudly(acme, settings):
    row = acme.data_keys.get(version=1)
    settings.MASTER_KEY = base64.b64encode(os.urandom(32)).decode()
    with pytest.raises(keys.KeyUnwrapError, match="wrapped by master key"):
        data_key_get(tenant=acme)
    with pytest.raises(keys.KeyUnwrapError, match="not the one it was wrapped with"):
        keys.data_key_unwrap(row.wrapped_key)


@pytest.mark.parametrize("value", ["", "not base64!", base64.b64encode(b"short").decode()])
def test_missing_or_malformed_master_key_is_named(settings, value):
    settings.MASTER_KEY = value
    with pytest.raises(keys.MasterKeyMissing, match="AGENTPLATFORM_MASTER_KEY"):
        keys.master_key()
