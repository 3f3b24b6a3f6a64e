"""Rates: per API key and per tenant (429 throttled, Retry-After, the API's error shape), and
failed admin logins per address and username. Counters live in the Redis cache."""

import uuid

from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.test import Client, override_settings

from tenants.services import api_key_create
from tenants.throttling import TenantRateThrottle, admin_login_failures_key
from tests.support.api import api_client


def throttled(response):
    assert response.status_code == 429, response.content
    assert response.json()["error"]["code"] == "throttled"
    assert 1 <= int(response["Retry-After"]) <= 60
    return True


@override_settings(API_RATE_PER_KEY="3/minute")
def test_a_key_over_its_rate_is_429_with_retry_after_and_other_keys_are_not(acme):
    _, busy = api_key_create(tenant=acme, name="busy")
    _, calm = api_key_create(tenant=acme, name="calm")
    client = api_client(busy)
    assert [client.get("/api/v1/runs").status_code for _ in range(3)] == [200, 200, 200]
    assert throttled(client.get("/api/v1/runs"))
    assert throttled(client.post("/api/v1/runs", {"agent": "research"}, format="json"))
    assert api_client(calm).get("/api/v1/runs").status_code == 200


def test_a_tenant_over_its_rate_is_429_for_all_its_keys_and_not_for_another_tenant(
        acme, globex_api):
    _, first = api_key_create(tenant=acme, name="first")
    _, second = api_key_create(tenant=acme, name="second")
    cache.delete(TenantRateThrottle.cache_key_for("acme"))  # earlier tests' acme requests
    with override_settings(API_RATE_PER_TENANT="4/minute"):
        codes = [api_client(key).get("/api/v1/agents").status_code
                 for key in (first, second, first, second)]
        assert codes == [200, 200, 200, 200]
        assert throttled(api_client(first).get("/api/v1/agents"))
        assert throttled(api_client(second).get("/api/v1/agents"))
        _, fresh = api_key_create(tenant=acme, name="fresh")
        assert throttled(api_client(fresh).get("/api/v1/agents"))  # more keys, no more requests
        assert globex_api.get("/api/v1/agents").status_code == 200
    cache.delete(TenantRateThrottle.cache_key_for("acme"))


def admin_login(client, username, password):
    return client.post("/admin/login/?next=/admin/", {"username": username, "password": password})


@override_settings(ADMIN_LOGIN_MAX_FAILURES=3, ADMIN_LOGIN_LOCKOUT_SECONDS=120)
def test_failed_admin_logins_lock_that_username_from_that_address():
    name, password = f"founder-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    get_user_model().objects.create_user(name, password=password, is_staff=True,
                                         is_superuser=True)
    guesser = Client(REMOTE_ADDR="203.0.113.7")
    assert [admin_login(guesser, name, "wrong").status_code for _ in range(3)] == [200] * 3
    locked = admin_login(guesser, name, password)  # even the right password, for a while
    assert locked.status_code == 429 and 1 <= int(locked["Retry-After"]) <= 120
    assert admin_login(guesser, name.upper(), password).status_code == 429
    # another address logs in as that user; the guesser may still try other names
    assert admin_login(Client(REMOTE_ADDR="198.51.100.2"), name, password).status_code == 302
    assert admin_login(guesser, "someone-else", "wrong").status_code == 200
    cache.delete_many([admin_login_failures_key("203.0.113.7", name),
                       admin_login_failures_key("203.0.113.7", "someone-else")])


@override_settings(ADMIN_LOGIN_MAX_FAILURES=3)
def test_a_successful_admin_login_clears_the_failures():
    name, password = f"founder-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    get_user_model().objects.create_user(name, password=password, is_staff=True)
    client = Client(REMOTE_ADDR="203.0.113.8")
    assert admin_login(client, name, "wrong").status_code == 200
    assert admin_login(client, name, "wrong").status_code == 200
    assert admin_login(client, name, password).status_code == 302
    client.logout()
    assert [admin_login(client, name, "wrong").status_code for _ in range(3)] == [200] * 3
    assert admin_login(client, name, password).status_code == 429
    cache.delete(admin_login_failures_key("203.0.113.8", name))


UNREACHABLE_CACHE = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache",
                                 "LOCATION": "redis://127.0.0.1:1/0",  # nothing listens there
                                 "OPTIONS": {"socket_connect_timeout": 0.5}}}


@override_settings(API_RATE_PER_KEY="1/minute", CACHES=UNREACHABLE_CACHE)
def test_rates_let_requests_through_when_the_cache_is_unreachable(acme):
    _, plaintext = api_key_create(tenant=acme, name="no-cache")
    client = api_client(plaintext)
    assert [client.get("/api/v1/agents").status_code for _ in range(2)] == [200, 200]
