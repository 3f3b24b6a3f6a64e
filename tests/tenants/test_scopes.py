"""API key scopes: every endpoint declares the scopes it needs, a key without them gets 403
insufficient_scope naming them, and an endpoint that declares none is refused to every key."""

import io
import uuid

import pytest
from django.core.management import call_command
from django.db import IntegrityError, transaction
from django.urls import URLPattern, URLResolver, get_resolver
from rest_framework.test import APIRequestFactory
from rest_framework.views import APIView

from tenants.authentication import HasRequiredScope, required_scopes
from tenants.models import ApiKey, Scope
from tenants.services import TenantError, api_key_authenticate, api_key_create
from tests.support.api import api_client


def error_of(response):
    return response.status_code, response.json()["error"]["code"]


def api_views(resolver=None, prefix=""):
    """(route, view class, init kwargs) of every DRF view in the URLconf."""
    for entry in (resolver or get_resolver()).url_patterns:
        route = prefix + str(entry.pattern)
        if isinstance(entry, URLResolver):
            yield from api_views(entry, route)
        elif isinstance(entry, URLPattern) and hasattr(entry.callback, "cls"):
            yield route, entry.callback.cls, entry.callback.initkwargs


def test_every_api_view_declares_the_scopes_of_each_of_its_methods():
    views = list(api_views())
    assert len(views) > 20, "the walk found the API"
    for route, cls, initkwargs in views:
        view = cls(**initkwargs)
        if not view.authentication_classes and not view.permission_classes:
            continue  # public (the schema): no key is asked for, so no scope either
        assert HasRequiredScope in view.permission_classes, f"{route}: scope check dropped"
        methods = [m for m in view.allowed_methods if m not in ("OPTIONS", "HEAD")]
        for method in methods:
            assert required_scopes(view, method), f"{route} {method} declares no scope"
        assert set(view.required_scopes) == set(methods), f"{route}: scopes for missing methods"
    assert required_scopes(views_by_route()["api/v1/runs/<uuid:run_id>/fork"], "POST") == (
        "runs:write", "approvals:decide")


def views_by_route():
    return {route: cls(**initkwargs) for route, cls, initkwargs in api_views()}


def test_a_view_that_declares_no_scope_is_refused_to_every_key(acme):
    class Undeclared(APIView):
        def get(self, request):
            return None

    _, plaintext = api_key_create(tenant=acme, name="everything")
    request = APIRequestFactory().get("/undeclared", HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    response = Undeclared.as_view()(request)
    assert response.status_code == 403
    assert response.data["error"]["code"] == "insufficient_scope"


def test_keys_made_with_a_tenant_hold_every_scope(acme):
    assert set(acme.api_keys.order_by("created_at").first().scopes) == set(Scope.values)
    key, _ = api_key_create(tenant=acme, name="unscoped call")
    assert key.scopes == list(Scope.values)


def test_a_read_only_key_reads_but_does_not_write(acme):
    _, plaintext = api_key_create(tenant=acme, name="dashboard", scopes=["runs:read"])
    client = api_client(plaintext)
    assert client.get("/api/v1/runs").status_code == 200
    assert client.get("/api/v1/agents").status_code == 200
    refused = client.post("/api/v1/runs", {"agent": "research"}, format="json")
    assert error_of(refused) == (403, "insufficient_scope")
    assert "runs:write" in refused.json()["error"]["message"]
    for method, path, body in [
        ("post", f"/api/v1/runs/{uuid.uuid4()}/cancel", None),
        ("post", f"/api/v1/approvals/{uuid.uuid4()}/decide", {"decision": "approve"}),
        ("post", "/api/v1/events", {"kind": "docs.signed", "key": "k"}),
        ("post", "/api/v1/outbox/1/settle", {"delivered": True}),
        ("get", "/api/v1/credentials", None),
        ("get", "/api/v1/connections/slack", None),
        ("put", "/api/v1/credentials/slack/default", {"secrets": {"bot_token": "x"}}),
    ]:
        response = getattr(client, method)(path, body, format="json")
        assert error_of(response) == (403, "insufficient_scope"), (method, path)


def test_head_is_get_and_options_needs_any_scope_of_the_endpoint(acme):
    _, reader = api_key_create(tenant=acme, name="reader", scopes=["runs:read"])
    _, operator = api_key_create(tenant=acme, name="operator", scopes=["admin"])
    assert api_client(reader).head("/api/v1/runs").status_code == 200
    assert api_client(reader).options("/api/v1/runs").status_code == 200
    assert api_client(operator).head("/api/v1/runs").status_code == 403  # HEAD: no body
    assert error_of(api_client(operator).options("/api/v1/runs")) == (403, "insufficient_scope")
    assert api_client(operator).options("/api/v1/credentials").status_code == 200


def test_a_write_only_key_does_not_read(acme):
    _, plaintext = api_key_create(tenant=acme, name="ci", scopes=["runs:write"])
    client = api_client(plaintext)
    assert error_of(client.get("/api/v1/runs")) == (403, "insufficient_scope")
    assert error_of(client.get(f"/api/v1/runs/{uuid.uuid4()}")) == (403, "insufficient_scope")
    created = client.post("/api/v1/runs", {"agent": "no-such-agent"}, format="json")
    assert error_of(created) == (404, "unknown_agent")  # past the scope check


def test_forking_needs_the_right_to_decide_approvals_too(acme):
    _, runner = api_key_create(tenant=acme, name="runner", scopes=["runs:read", "runs:write"])
    _, decider = api_key_create(tenant=acme, name="lead",
                                scopes=["runs:write", "approvals:decide"])
    missing = uuid.uuid4()
    refused = api_client(runner).post(f"/api/v1/runs/{missing}/fork", {"visit": 0}, format="json")
    assert error_of(refused) == (403, "insufficient_scope")
    assert "approvals:decide" in refused.json()["error"]["message"]
    allowed = api_client(decider).post(f"/api/v1/runs/{missing}/fork", {"visit": 0}, format="json")
    assert error_of(allowed) == (404, "not_found")


def test_credentials_and_connections_need_admin(acme):
    _, operator = api_key_create(tenant=acme, name="ops", scopes=["admin"])
    _, worker = api_key_create(tenant=acme, name="worker",
                               scopes=["runs:read", "runs:write", "approvals:decide", "events:write"])
    for path in ["/api/v1/credentials", "/api/v1/connections/slack", "/api/v1/connections/gmail"]:
        assert api_client(operator).get(path).status_code == 200, path
        assert error_of(api_client(worker).get(path)) == (403, "insufficient_scope"), path
    assert error_of(api_client(operator).get("/api/v1/runs")) == (403, "insufficient_scope")


def test_the_api_key_command_makes_a_key_with_fewer_scopes(acme):
    out = io.StringIO()
    call_command("api_key", "create", "acme", "--name", "reader", "--scopes",
                 "runs:read,events:write", stdout=out)
    plaintext = out.getvalue().strip().rsplit(" ", 1)[-1]
    assert api_key_authenticate(presented=plaintext).scopes == ["runs:read", "events:write"]
    listed = io.StringIO()
    call_command("api_key", "list", "acme", stdout=listed)
    assert "reader  runs:read,events:write" in listed.getvalue()


def test_unknown_scopes_are_refused_by_the_service_and_the_database(acme):
    with pytest.raises(TenantError) as refused:
        api_key_create(tenant=acme, name="root", scopes=["runs:read", "root"])
    assert refused.value.code == "unknown_scope"
    with pytest.raises(TenantError):
        api_key_create(tenant=acme, name="nothing", scopes=[])
    key, _ = api_key_create(tenant=acme, name="constrained", scopes=["runs:read"])
    with pytest.raises(IntegrityError), transaction.atomic():
        ApiKey.objects.filter(pk=key.pk).update(scopes=["runs:read", "superuser"])
