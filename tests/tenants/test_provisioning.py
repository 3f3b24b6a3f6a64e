"""Provisioning: schema + migrations + data key + first API key; idempotent; explicit deletion."""

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django_tenants.utils import schema_exists, tenant_context

from runs.models import Run
from tenants.models import ApiKey, Tenant, TenantKey
from tenants.services import TenantError, tenant_create, tenant_delete


def test_create_tenant_twice_reports_it_exists_and_changes_nothing(capsys, acme):
    before = (list(ApiKey.objects.filter(tenant=acme).values_list("id", "key_hash")),
              list(TenantKey.objects.filter(tenant=acme).values_list("id", "wrapped_key")))
    call_command("create_tenant", "acme")
    assert "already exists; nothing changed" in capsys.readouterr().out
    after = (list(ApiKey.objects.filter(tenant=acme).values_list("id", "key_hash")),
             list(TenantKey.objects.filter(tenant=acme).values_list("id", "wrapped_key")))
    assert before == after


@pytest.mark.parametrize("name", ["Acme", "1acme", "acme-corp", "public", "pg_catalog", "",
                                  "a" * 41, "acme; DROP SCHEMA public"])
def test_invalid_schema_name_is_refused_with_a_clear_error(name):
    with pytest.raises(TenantError, match="not a valid tenant name"):
        tenant_create(schema_name=name)
    with pytest.raises(CommandError, match="not a valid tenant name"):
        call_command("create_tenant", name)
    assert not Tenant.objects.filter(schema_name=name).exists()


def test_provisioning_creates_schema_key_and_data_key_and_deletion_leaves_nothing(capsys, s3):
    call_command("create_tenant", "umbrella")
    output = capsys.readouterr().out
    plaintext = output.split("store it now): ")[1].strip()
    tenant = Tenant.objects.get(schema_name="umbrella")
    assert plaintext.startswith("ap_") and schema_exists("umbrella")
    assert tenant.api_keys.count() == 1 and tenant.data_keys.count() == 1
    with tenant_context(tenant):
        Run.objects.create(agent="research", agent_version=1, topology_hash="x")
    with pytest.raises(CommandError, match="--yes"):
        call_command("delete_tenant", "umbrella")
    assert schema_exists("umbrella")

    call_command("delete_tenant", "umbrella", "--yes")
    assert not schema_exists("umbrella")
    assert not Tenant.objects.filter(schema_name="umbrella").exists()
    assert not ApiKey.objects.filter(tenant_id=tenant.id).exists()
    assert not TenantKey.objects.filter(tenant_id=tenant.id).exists()


def test_public_schema_cannot_be_deleted_as_a_tenant():
    with pytest.raises(TenantError):
        tenant_delete(tenant=Tenant(schema_name="public"))
    assert connection.schema_name == "public"
