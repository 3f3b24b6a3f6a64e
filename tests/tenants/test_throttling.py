"""Rates: per API key and per tenant (429 throttled, Retry-After, the API's error shape), and
failed admin logins per address and username. Counters live in the Redis cache."""

import threading
import uuid

from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.db import connections
from django.test import Client, override_settings

from tenants.services import api_key_create
from tenants.throttling import (
    TenantRateThrottle,
    admin_login_failures_key,
    admin_login_username_failures_key,
)
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


@override_settings(API_RATE_PER_KEY="5/minute")
def test_parallel_requests_of_one_key_are_all_counted(acme):
    _, key = api_key_create(tenant=acme, name="racer")
    codes, barrier = [], threading.Barrier(12)

    def hit():
        try:
            client = api_client(key)
            barrier.wait(timeout=30)
            codes.append(client.get("/api/v1/agents").status_code)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=hit) for _ in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(codes) == [200] * 5 + [429] * 7


FULLWIDTH = {c: chr(ord(c) - 0x21 + 0xFF01) for c in "abcdefghijklmnopqrstuvwxyz0123456789-"}


@override_settings(ADMIN_LOGIN_MAX_FAILURES=3, ADMIN_LOGIN_LOCKOUT_SECONDS=120)
def test_spellings_that_log_in_as_one_user_share_its_failures():
    name, password = f"founder{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    get_user_model().objects.create_user(name, password=password, is_staff=True,
                                         is_superuser=True)
    guesser = Client(REMOTE_ADDR="203.0.113.99")
    assert [admin_login(guesser, name, "wrong").status_code for _ in range(3)] == [200] * 3
    for spelling in (FULLWIDTH[name[0]] + name[1:], "".join(FULLWIDTH[c] for c in name),
                     f" {name.upper()} "):  # NFKC and strip make each one `name` at the form
        assert admin_login(guesser, spelling, "wrong").status_code == 429
        assert admin_login(guesser, spelling, password).status_code == 429
    cache.delete_many([admin_login_failures_key("203.0.113.99", name),
                       admin_login_username_failures_key(name)])


@override_settings(ADMIN_LOGIN_MAX_FAILURES=100, ADMIN_LOGIN_USERNAME_MAX_FAILURES=4,
                   ADMIN_LOGIN_USERNAME_LOCKOUT_SECONDS=60)
def test_failures_of_one_username_from_many_addresses_lock_it_for_a_short_while():
    name, password = f"founder-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    get_user_model().objects.create_user(name, password=password, is_staff=True)
    codes = [admin_login(Client(REMOTE_ADDR=f"198.51.100.{i}"), FULLWIDTH[name[0]] + name[1:],
                         "wrong").status_code for i in range(4)]
    assert codes == [200] * 4
    locked = admin_login(Client(REMOTE_ADDR="192.0.2.200"), name, password)
    assert locked.status_code == 429 and 1 <= int(locked["Retry-After"]) <= 60
    assert admin_login(Client(REMOTE_ADDR="192.0.2.200"), "someone-else", "wrong").status_code == 200
    cache.delete_many([admin_login_username_failures_key(name),
                       f"{admin_login_username_failures_key(name)}:since",
                       admin_login_username_failures_key("someone-else")])
    assert admin_login(Client(REMOTE_ADDR="192.0.2.200"), name, password).status_code == 302
