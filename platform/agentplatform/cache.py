"""The cache backend: Django's Redis cache, with one client per connection pool.

Django's `RedisCacheClient` makes a new `redis.Redis` for every cache call, and each one builds
its table of response callbacks (about a hundred entries): an API request makes several cache
calls (its throttles), so that was a measurable share of a request's CPU (docs/benchmarks.md,
throughput). A `redis.Redis` is safe to share between calls over its pool, and Django already
keeps one cache object per thread.
"""

from django.core.cache.backends.redis import RedisCache as DjangoRedisCache
from django.core.cache.backends.redis import RedisCacheClient


class PooledClients(RedisCacheClient):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._clients = {}

    def get_client(self, key=None, *, write=False):
        pool = self._get_connection_pool(write)
        client = self._clients.get(id(pool))
        if client is None:
            client = self._clients[id(pool)] = self._client(connection_pool=pool)
        return client


class RedisCache(DjangoRedisCache):
    def __init__(self, server, params):
        super().__init__(server, params)
        self._class = PooledClients
