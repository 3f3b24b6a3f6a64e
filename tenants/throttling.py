"""Request rates: per API key and per tenant (fixed windows counted atomically in Redis), and failed
admin logins per client address and username, and per username from anywhere. Over a rate: 429
`throttled` with Retry-After.

Rates are read from settings at each request (API_RATE_PER_KEY, API_RATE_PER_TENANT), so an
operator's change, or a test's override_settings, applies at once. The cache out of reach lets
requests through: Redis down must not take the API down with it (docs/decisions/0015)."""

import hashlib
import logging
import math
import time
import uuid
from datetime import UTC, datetime

from django.conf import settings
from django.contrib.auth.forms import UsernameField
from django.core.cache import cache
from django.http import HttpResponse
from django.template.loader import render_to_string
from django.urls import reverse
from redis.exceptions import RedisError
from rest_framework.throttling import SimpleRateThrottle

log = logging.getLogger(__name__)


# One sliding window, checked and counted in one step: drop the times older than the window;
# under the limit, add this request's time. DRF's own throttle reads the history, then writes it
# back: requests racing between the two all got through. A refused request is not counted.
_SLIDING_WINDOW = """
local now, window, limit = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
if redis.call('ZCARD', KEYS[1]) >= limit then
  return redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')[2]
end
redis.call('ZADD', KEYS[1], now, ARGV[4])
redis.call('EXPIRE', KEYS[1], math.ceil(window) + 1)
return false
"""


class _CallerThrottle(SimpleRateThrottle):
    """A sliding window of request times per caller, from the setting named `rate_setting`,
    kept in a Redis sorted set and updated atomically (_SLIDING_WINDOW)."""

    rate_setting = ""
    cache_format = "throttle-zset_%(scope)s_%(ident)s"  # not DRF's key: that held a pickled list

    def get_rate(self):
        return getattr(settings, self.rate_setting) or None  # empty: no limit

    def __init__(self):
        self.rate = self.get_rate()  # read now, not when the class was imported
        self.num_requests, self.duration = self.parse_rate(self.rate)
        self.wait_seconds = None

    def ident_of(self, request) -> str | None:
        raise NotImplementedError

    def get_cache_key(self, request, view):
        ident = self.ident_of(request)
        return None if ident is None else self.cache_key_for(ident)

    @classmethod
    def cache_key_for(cls, ident: str) -> str:
        return cls.cache_format % {"scope": cls.scope, "ident": ident}

    def allow_request(self, request, view):
        if self.rate is None:
            return True
        key = self.get_cache_key(request, view)
        if key is None:
            return True
        now = time.time()
        try:
            oldest = _sliding_window_hit(key, now=now, window=self.duration,
                                         limit=self.num_requests)
        except RedisError as exc:
            log.warning("throttle %s: cache unavailable, request let through: %s", self.scope, exc)
            return True
        if oldest is None:
            return True
        self.wait_seconds = max(0.0, float(oldest) + self.duration - now)
        return False

    def wait(self):
        return self.wait_seconds


def _sliding_window_hit(key: str, *, now: float, window: int, limit: int):
    """None if this request fits in the window (and is counted), else the oldest time in it.
    The sorted set is at the cache's own key for `key` (so cache.delete(key) clears it), through
    the cache's Redis connection (Django's cache API has no scripting)."""
    full_key = cache.make_key(key)
    client = cache._cache.get_client(full_key, write=True)
    return client.eval(_SLIDING_WINDOW, 1, full_key, now, window, limit, uuid.uuid4().hex)


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


class TenantPlanRateThrottle(_CallerThrottle):
    """The tenant's own API requests per minute (its plan or override, runs.usage): the rate
    comes from `rate_of(tenant)`, which the usage app sets at start-up (this layer cannot read
    plans). No rate: no limit."""

    scope = "tenant_plan"
    rate_of = None  # (tenant) -> requests per minute, or None

    def __init__(self):
        self.rate, self.wait_seconds = None, None

    def allow_request(self, request, view):
        tenant = getattr(request.user, "tenant", None)
        if tenant is None or type(self).rate_of is None:
            return True
        try:
            per_minute = type(self).rate_of(tenant)
        except Exception as exc:  # a quota that cannot be read must not take the API down
            log.warning("throttle %s: rate of %s unreadable, request let through: %s",
                        self.scope, tenant, exc)
            return True
        if per_minute is None:
            return True
        self.rate = f"{per_minute}/min"
        self.num_requests, self.duration = int(per_minute), 60
        return super().allow_request(request, view)

    def ident_of(self, request):
        tenant = getattr(request.user, "tenant", None)
        return tenant.schema_name if tenant is not None else None

    @classmethod
    def requests_last_minute(cls, schema: str, *, now: float | None = None) -> int | None:
        """The tenant's requests counted in the window now (None: Redis out of reach)."""
        full_key = cache.make_key(cls.cache_key_for(schema))
        now = time.time() if now is None else now
        try:
            client = cache._cache.get_client(full_key, write=False)
            return int(client.zcount(full_key, now - 60, "+inf"))
        except RedisError:
            return None


# -- API requests per tenant and day (metering) ----------------------------------------------

API_REQUESTS_KEEP_SECONDS = 3 * 86400  # the usage task copies them well before they expire


def api_requests_key(schema: str, day) -> str:
    # a hash {"n": count, "life": id of the Redis life that counted it}; not the plain counter
    # the key "usage-api-requests:..." held before, so the two are never read as one
    return f"usage-api-request-count:{schema}:{day.isoformat()}"


def api_request_count(*, schema: str, now: datetime | None = None) -> None:
    """Count one authenticated API request for the tenant's UTC day (one MULTI; Redis out of
    reach loses the count, never the request). The hash's `life` is set by its first count: a
    Redis that restarted empty starts a new life, so the usage task adds the new count to what
    it had copied instead of waiting for the new count to pass the old one."""
    day = (now or datetime.now(UTC)).date()
    full_key = cache.make_key(api_requests_key(schema, day))
    try:
        client = cache._cache.get_client(full_key, write=True)
        pipe = client.pipeline(transaction=True)
        pipe.hsetnx(full_key, "life", uuid.uuid4().hex)
        pipe.hincrby(full_key, "n", 1)
        pipe.expire(full_key, API_REQUESTS_KEEP_SECONDS)
        pipe.execute()
    except RedisError as exc:
        log.warning("api request count for %s lost: cache unavailable: %s", schema, exc)


def api_requests_read(*, schema: str, day) -> tuple[str, int] | None:
    """(life, the day's count so far in it): ("", 0) if none counted; None if Redis is out of
    reach."""
    full_key = cache.make_key(api_requests_key(schema, day))
    try:
        client = cache._cache.get_client(full_key, write=False)
        life, count = client.hmget(full_key, ["life", "n"])
    except RedisError:
        return None
    return (life.decode() if isinstance(life, bytes) else life or ""), int(count or 0)


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


def admin_login_username(raw: str) -> str:
    """The username as the login form reads it (Django's UsernameField: stripped, then NFKC, so
    "ｆounder" logs in as "founder"), casefolded: every spelling that can log in as one account
    is counted as that account."""
    return (UsernameField().to_python(raw) or "").casefold()


def _username_digest(username: str) -> str:
    return hashlib.sha256(admin_login_username(username).encode("utf-8", "surrogatepass")).hexdigest()[:32]


def admin_login_failures_key(address: str, username: str) -> str:
    return f"admin-login-failures:{address}:{_username_digest(username)}"


def admin_login_username_failures_key(username: str) -> str:
    return f"admin-login-failures:any:{_username_digest(username)}"


def _login_limits(request, username: str) -> list[tuple[str, int, int]]:
    """(cache key, most failures, lockout seconds) of each count a failed login of `username`
    from this client adds to: the address's and the username's from anywhere."""
    return [(admin_login_failures_key(client_address(request), username),
             settings.ADMIN_LOGIN_MAX_FAILURES, settings.ADMIN_LOGIN_LOCKOUT_SECONDS),
            (admin_login_username_failures_key(username),
             settings.ADMIN_LOGIN_USERNAME_MAX_FAILURES, settings.ADMIN_LOGIN_USERNAME_LOCKOUT_SECONDS)]


def login_locked_for(request, username: str) -> int | None:
    """Seconds until `username` may try a password again from this client; None: now (or the
    cache is out of reach: a person is let through)."""
    limits = _login_limits(request, username)
    try:
        counts = cache.get_many([key for key, _, _ in limits])
        for key, most, lockout in limits:
            if most and (counts.get(key) or 0) >= most:
                since = cache.get(f"{key}:since") or time.time()
                return max(1, math.ceil(since + lockout - time.time()))
    except RedisError as exc:
        log.warning("admin login throttle: cache unavailable: %s", exc)
    return None


def login_failure_record(request, username: str) -> None:
    """Count a wrong password for `username` from this client (the login forms' and the account
    page's): each count's window starts at its first failure."""
    try:
        for key, most, lockout in _login_limits(request, username):
            if not most:
                continue
            try:
                cache.add(f"{key}:since", time.time(), timeout=lockout)
                cache.add(key, 0, timeout=lockout)
                cache.incr(key)  # atomic in Redis: parallel guesses are all counted
            except ValueError:
                pass  # the count expired between add and incr: no new window
    except RedisError as exc:
        log.warning("admin login throttle: cache unavailable: %s", exc)


class AdminLoginThrottleMiddleware:
    """Two counts of failed admin logins, each locking the login with 429 (Retry-After), even to
    the right password, until its window (from the first failure counted) ends:

    - ADMIN_LOGIN_MAX_FAILURES for one username from one address, for
      ADMIN_LOGIN_LOCKOUT_SECONDS;
    - ADMIN_LOGIN_USERNAME_MAX_FAILURES for one username from any address (a guesser with many
      addresses), for the shorter ADMIN_LOGIN_USERNAME_LOCKOUT_SECONDS: anyone can fail logins
      as any username, so this lock is kept short; a sustained attack can keep renewing it
      (docs/decisions/0015). 0 turns it off.

    The username is counted as the login form reads it (admin_login_username). A successful
    login clears the address's count (the username's is left to expire). The dashboard's
    account page counts wrong current passwords in the same counts (login_failure_record)."""

    def __init__(self, get_response):
        self.get_response = get_response

    @staticmethod
    def _refusal(request, wait: int) -> HttpResponse:
        if request.path == reverse("dashboard:login"):  # a person's browser: a page to read
            return HttpResponse(render_to_string("429.html", {"wait_minutes": math.ceil(wait / 60)},
                                                 request=request), status=429)
        return HttpResponse("Too many failed logins; try again later.\n", status=429,
                            content_type="text/plain; charset=utf-8")

    def __call__(self, request):
        if request.method != "POST" or request.path not in (reverse("admin:login"),
                                                            reverse("dashboard:login")):
            return self.get_response(request)
        username = request.POST.get("username", "")
        address_key = admin_login_failures_key(client_address(request), username)
        wait = login_locked_for(request, username)
        if wait is not None:
            response = self._refusal(request, wait)
            response["Retry-After"] = str(wait)
            return response
        response = self.get_response(request)
        if response.status_code == 200:  # the form again: the login failed
            login_failure_record(request, username)
        elif 300 <= response.status_code < 400:  # logged in: redirected on
            try:
                if cache.get(address_key):
                    cache.delete_many([address_key, f"{address_key}:since"])
            except RedisError as exc:
                log.warning("admin login throttle: cache unavailable: %s", exc)
        return response
