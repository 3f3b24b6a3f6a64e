"""Request rates: per API key and per tenant (DRF throttles on the Django cache, Redis), and failed
admin logins per client address and username. Over a rate: 429 `throttled` with Retry-After.

Rates are read from settings at each request (API_RATE_PER_KEY, API_RATE_PER_TENANT), so an
operator's change, or a test's override_settings, applies at once. The cache out of reach lets
requests through: Redis down must not take the API down with it (docs/decisions/0015)."""

import logging
import math
import time

from django.conf import settings
from django.core.cache import cache
from django.http import HttpResponse
from django.urls import reverse
from redis.exceptions import RedisError
from rest_framework.throttling import SimpleRateThrottle

log = logging.getLogger(__name__)


class _CallerThrottle(SimpleRateThrottle):
    """A sliding window of request times per caller, from the setting named `rate_setting`."""

    rate_setting = ""

    def get_rate(self):
        return getattr(settings, self.rate_setting) or None  # empty: no limit

    def __init__(self):
        self.rate = self.get_rate()  # read now, not when the class was imported
        self.num_requests, self.duration = self.parse_rate(self.rate)

    def ident_of(self, request) -> str | None:
        raise NotImplementedError

    def get_cache_key(self, request, view):
        ident = self.ident_of(request)
        return None if ident is None else self.cache_key_for(ident)

    @classmethod
    def cache_key_for(cls, ident: str) -> str:
        return cls.cache_format % {"scope": cls.scope, "ident": ident}

    def allow_request(self, request, view):
        try:
            return super().allow_request(request, view)
        except RedisError as exc:
            log.warning("throttle %s: cache unavailable, request let through: %s", self.scope, exc)
            return True


class ApiKeyRateThrottle(_CallerThrottle):
    scope = "api_key"
    rate_setting = "API_RATE_PER_KEY"

    def ident_of(self, request):
        key = getattr(request.user, "api_key", None)
        return key.prefix if key is not None else None


class TenantRateThrottle(_CallerThrottle):
    """All of a tenant's keys together: more keys do not buy a tenant more requests."""

    scope = "tenant"
    rate_setting = "API_RATE_PER_TENANT"

    def ident_of(self, request):
        tenant = getattr(request.user, "tenant", None)
        return tenant.schema_name if tenant is not None else None


# -- the admin login ---------------------------------------------------------------------------

def client_address(request) -> str:
    """The client's IP: REMOTE_ADDR, or behind TRUSTED_PROXY_COUNT proxies the address the
    outermost trusted proxy saw (X-Forwarded-For, counted from the right)."""
    proxies = settings.TRUSTED_PROXY_COUNT
    forwarded = [part.strip() for part in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",")
                 if part.strip()]
    if proxies and forwarded:
        return forwarded[-min(proxies, len(forwarded))]
    return request.META.get("REMOTE_ADDR", "")


def admin_login_failures_key(address: str, username: str) -> str:
    return f"admin-login-failures:{address}:{username.strip().lower()[:150]}"


class AdminLoginThrottleMiddleware:
    """After ADMIN_LOGIN_MAX_FAILURES failed logins for one username from one address, the
    admin login answers 429 (Retry-After) until ADMIN_LOGIN_LOCKOUT_SECONDS after the first of
    them, even to the right password. A successful login clears the count."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if request.method != "POST" or request.path != reverse("admin:login"):
            return self.get_response(request)
        key = admin_login_failures_key(client_address(request), request.POST.get("username", ""))
        failures = 0
        try:
            failures = cache.get(key) or 0
            if failures >= settings.ADMIN_LOGIN_MAX_FAILURES:
                since = cache.get(f"{key}:since") or time.time()
                response = HttpResponse("Too many failed logins; try again later.\n", status=429,
                                        content_type="text/plain; charset=utf-8")
                wait = since + settings.ADMIN_LOGIN_LOCKOUT_SECONDS - time.time()
                response["Retry-After"] = str(max(1, math.ceil(wait)))
                return response
        except RedisError as exc:
            log.warning("admin login throttle: cache unavailable: %s", exc)
        response = self.get_response(request)
        try:
            if response.status_code == 200:  # the form again: the login failed
                lockout = settings.ADMIN_LOGIN_LOCKOUT_SECONDS
                cache.add(f"{key}:since", time.time(), timeout=lockout)
                cache.add(key, 0, timeout=lockout)
                cache.incr(key)  # atomic in Redis: parallel guesses are all counted
            elif failures and 300 <= response.status_code < 400:  # logged in: redirected on
                cache.delete_many([key, f"{key}:since"])
        except ValueError:
            pass  # the count expired between add and incr: this failure starts no new window
        except RedisError as exc:
            log.warning("admin login throttle: cache unavailable: %s", exc)
        return response
