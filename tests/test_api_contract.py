"""The API is a contract (docs/decisions/0016-api-contract.md): schemathesis fuzzes every
operation of the OpenAPI schema against a real HTTP server process with a real tenant's API key,
with all its default checks, and finds nothing; the docs page and its assets come from the
platform itself."""

import re

import pytest
import requests
import schemathesis
from django.db import connection
from django.test import Client
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings
from schemathesis.checks import positive_data_acceptance

from tenants.services import tenant_create, tenant_delete
from tests.support.live_server import LiveServer


@pytest.fixture(scope="module")
def api_server(django_db_setup):
    server = LiveServer(name="api-server", ready_path="/api/v1/schema").start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def fuzzed_tenant_key(django_db_setup, django_db_blocker, s3):  # deleting a tenant empties its S3 prefix
    """A tenant of its own for the fuzzer, so its rows never meet acme's or globex's tests; dropped
    afterwards with everything the fuzzer made."""
    with django_db_blocker.unblock():
        provisioned = tenant_create(schema_name="contract")
        connection.set_schema_to_public()
    yield provisioned.api_key
    with django_db_blocker.unblock():
        tenant_delete(tenant=provisioned.tenant)
        connection.set_schema_to_public()


def _served_schema() -> dict:
    """The schema as /api/v1/schema answers it (the live server serves the same: see below).
    Loaded at collection, as schemathesis' eager loader wants: its fixture-based lazy loader
    does not run under pytest 9.2."""
    return Client(HTTP_HOST="localhost").get("/api/v1/schema?format=json").json()


schema = schemathesis.openapi.from_dict(_served_schema())
# PostgreSQL cannot store U+0000 in text or jsonb: the API refuses it with 400 (see
# test_a_nul_character_in_a_body_is_refused_not_a_500), so generated valid data leaves it out.
schema.config.generation.update(allow_x00=False)


# A definition is a program checked against the tenant's state (its credential labels, the
# platform's agent names) and by the definition language (a tool's JSON Schema must itself be
# valid, tool names must not clash): no OpenAPI schema can say which are valid, so a schema-valid
# one may still be 400 invalid_definition with fields. Likewise a credential's secrets are the
# connector's to judge (an mcp server's url must be an http(s) URL with a host): a schema-valid
# one may be 400 invalid_secrets. The usage range is two dates that must be in order and at most
# 400 days apart, which no schema of two separate parameters can say: 400 invalid_filter. Every
# other check still holds for all three.
DATA_CHECKED_BEYOND_THE_SCHEMA = {("POST", "/api/v1/agents"): [positive_data_acceptance],
                                  ("PUT", "/api/v1/credentials/{connector}/{label}"):
                                      [positive_data_acceptance],
                                  ("GET", "/api/v1/usage"): [positive_data_acceptance]}


def test_the_live_server_serves_the_fuzzed_schema(api_server):
    served = requests.get(f"{api_server.url}/api/v1/schema?format=json", timeout=10)
    assert served.status_code == 200
    assert served.json() == schema.raw_schema


@schema.parametrize()
@hypothesis_settings(max_examples=25, derandomize=True, deadline=None,
                     suppress_health_check=list(HealthCheck))
def test_every_operation_keeps_its_contract(case, api_server, fuzzed_tenant_key):
    case.call_and_validate(base_url=api_server.url,
                           headers={"Authorization": f"Bearer {fuzzed_tenant_key}"},
                           excluded_checks=DATA_CHECKED_BEYOND_THE_SCHEMA.get(
                               (case.method.upper(), case.path), []))


def test_docs_page_is_served_with_its_assets_from_the_platform(api_server):
    page = requests.get(f"{api_server.url}/api/v1/docs", timeout=10)
    assert page.status_code == 200
    assert "text/html" in page.headers["Content-Type"]
    scripts = re.findall(r'<script[^>]+src="([^"]+)"', page.text)
    styles = re.findall(r'<link[^>]+href="([^"]+\.css)"', page.text)
    assert scripts, page.text[:2000]
    for asset in scripts + styles:
        assert not re.match(r"^(https?:)?//", asset), f"{asset} is not served by the platform"
        served = requests.get(f"{api_server.url}{asset}", timeout=10)
        assert served.status_code == 200, asset
        assert len(served.content) > 1000, asset


def test_every_operation_documents_each_error_status_in_the_one_error_shape():
    operations = [(f"{method.upper()} {path}", operation)
                  for path, methods in schema.raw_schema["paths"].items()
                  for method, operation in methods.items()]
    assert len(operations) >= 25
    for label, operation in operations:
        assert operation["security"] == [{"apiKey": []}], label
        responses = operation["responses"]
        assert {"400", "401", "403", "404", "413", "429"} <= set(responses), label
        assert "Retry-After" in responses["429"]["headers"], label
        for status, response in responses.items():
            if status.startswith(("4", "5")):
                assert response["content"]["application/json"]["schema"] == {
                    "$ref": "#/components/schemas/Error"}, (label, status)
    error = schema.raw_schema["components"]["schemas"]["Error"]
    assert error["required"] == ["error"]
