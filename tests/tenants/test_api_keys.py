"""API keys: prefixed, random, hashed at rest, revocable, several per tenant; clear errors."""

import logging
from datetime import timedelta

import pytest
from django.db import connection

from tenants.models import ApiKey, Tenant
from tenants.services import (
    ApiKeyRejected,
    api_key_authenticate,
    api_key_create,
    api_key_revoke,
    tenant_create,
    tenant_delete,
    tenant_reactivate,
    tenant_suspend,
)
from tests.support.api import api_client


def error_of(response):
    assert response["Content-Type"].startswith("application/json"), response.content
    return response.status_code, response.json()["error"]["code"]


def test_missing_key_is_401_json():
    assert error_of(api_client(None).get("/api/v1/runs")) == (401, "not_authenticated")


@pytest.mark.parametrize("header", ["Basic abc", "Bearer", "Bearer not-a-key",
                                    "Bearer ap_short_x", "Token ap_abcdefghijkl_" + "a" * 43])
def test_malformed_key_is_401_json(header):
    client = api_client(None)
    client.credentials(HTTP_AUTHORIZATION=header)
    assert error_of(client.get("/api/v1/runs")) == (401, "invalid_api_key")


def test_unknown_key_is_401_json(acme):
    _, real = api_key_create(tenant=acme, name="probe")
    forged = real[:-4] + ("AAAA" if not real.endswith("AAAA") else "BBBB")
    unknown_prefix = "ap_zzzzzzzzzzzz_" + real.split("_", 2)[2]
    assert error_of(api_client(forged).get("/api/v1/runs")) == (401, "invalid_api_key")
    assert error_of(api_client(unknown_prefix).get("/api/v1/runs")) == (401, "invalid_api_key")


def test_revoked_key_is_401_and_other_keys_of_the_tenant_still_work(acme):
    key, plaintext = api_key_create(tenant=acme, name="ci")
    _, other = api_key_create(tenant=acme, name="dashboard")
    assert api_client(plaintext).get("/api/v1/runs").status_code == 200
    api_key_revoke(key=key)
    assert error_of(api_client(plaintext).get("/api/v1/runs")) == (401, "api_key_revoked")
    assert api_client(other).get("/api/v1/runs").status_code == 200


def test_suspended_tenant_is_403_until_reactivated(s3):  # deleting a tenant needs S3
    provisioned = tenant_create(schema_name="initech")
    try:
        client = api_client(provisioned.api_key)
        assert client.get("/api/v1/runs").status_code == 200
        tenant_suspend(tenant=provisioned.tenant)
        assert error_of(client.get("/api/v1/runs")) == (403, "tenant_suspended")
        tenant_reactivate(tenant=provisioned.tenant)
        assert client.get("/api/v1/runs").status_code == 200
    finally:
        tenant_delete(tenant=Tenant.objects.get(schema_name="initech"))


def test_last_used_time_is_recorded(acme):
    key, plaintext = api_key_create(tenant=acme, name="usage")
    assert key.last_used_at is None
    api_client(plaintext).get("/api/v1/runs")
    key.refresh_from_db()
    assert key.last_used_at is not None


def test_last_used_time_is_written_at_most_once_a_minute(acme):
    key, plaintext = api_key_create(tenant=acme, name="resolution")
    first = api_key_authenticate(presented=plaintext).last_used_at
    assert first is not None
    assert api_key_authenticate(presented=plaintext).last_used_at == first
    assert ApiKey.objects.get(pk=key.pk).last_used_at == first
    ApiKey.objects.filter(pk=key.pk).update(last_used_at=first - timedelta(minutes=2))
    again = api_key_authenticate(presented=plaintext).last_used_at
    assert again > first and ApiKey.objects.get(pk=key.pk).last_used_at == again


def test_a_key_selects_its_own_tenant_and_loads_it_as_the_orm_does(acme, globex):
    for tenant in (acme, globex):
        made, plaintext = api_key_create(tenant=tenant, name="whole", scopes=["runs:read"])
        key = api_key_authenticate(presented=plaintext)
        stored = ApiKey.objects.select_related("tenant").get(pk=made.pk)
        assert key.tenant.schema_name == tenant.schema_name and key.tenant_id == tenant.pk
        for got, want in ((key, stored), (key.tenant, stored.tenant)):
            for field in type(want)._meta.concrete_fields:
                assert getattr(got, field.attname) == getattr(want, field.attname), field.name
                assert type(getattr(got, field.attname)) is type(getattr(want, field.attname))
        assert key.scopes == ["runs:read"] and key._state.adding is False


def test_a_known_prefix_with_another_keys_secret_is_refused(acme, globex):
    _, acme_key = api_key_create(tenant=acme, name="mixed")
    _, globex_key = api_key_create(tenant=globex, name="mixed")
    acme_prefix, globex_secret = acme_key.split("_")[1], globex_key.split("_", 2)[2]
    with pytest.raises(ApiKeyRejected) as refused:
        api_key_authenticate(presented=f"ap_{acme_prefix}_{globex_secret}")
    assert refused.value.code == "invalid_api_key"


def test_keys_are_read_without_prepared_statements_too(acme):
    """DATABASE_PREPARED_STATEMENTS=0 (a pooler that cannot carry them): the same answers."""
    key, plaintext = api_key_create(tenant=acme, name="unprepared")
    connection.ensure_connection()
    threshold = connection.connection.prepare_threshold
    connection.connection.prepare_threshold = None
    try:
        assert api_key_authenticate(presented=plaintext).pk == key.pk
        api_key_revoke(key=key)
        with pytest.raises(ApiKeyRejected) as refused:
            api_key_authenticate(presented=plaintext)
        assert refused.value.code == "api_key_revoked"
    finally:
        connection.connection.prepare_threshold = threshold


def test_key_plaintext_is_nowhere_in_the_database_or_logs(acme, caplog):
    caplog.set_level(logging.DEBUG)
    key, plaintext = api_key_create(tenant=acme, name="secret")
    client = api_client(plaintext)
    client.get("/api/v1/runs")
    client.post("/api/v1/runs", {"agent": "nope"}, format="json")
    secret = plaintext.split("_", 2)[2]
    assert key.key_hash != plaintext and secret not in key.key_hash
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT table_schema, table_name FROM information_schema.tables "
            "WHERE table_schema IN ('public', 'acme', 'globex') AND table_type = 'BASE TABLE'"
        )
        for schema, table in cursor.fetchall():
            cursor.execute(
                f'SELECT count(*) FROM "{schema}"."{table}" t WHERE t::text LIKE %s',
                [f"%{secret}%"],
            )
            assert cursor.fetchone()[0] == 0, f"key found in {schema}.{table}"
    assert secret not in caplog.text
    assert ApiKey.objects.filter(prefix=key.prefix).count() == 1
