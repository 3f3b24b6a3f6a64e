"""The cache backend (agentplatform/cache.py) keeps one Redis client per pool instead of making
one per call, and is still Django's Redis cache to its callers."""

import uuid

from django.core.cache import cache


def test_calls_share_one_client_and_the_cache_works():
    client = cache._cache.get_client(write=True)
    assert cache._cache.get_client(write=True) is client
    assert cache._cache.get_client(write=False) is client  # one server: one pool
    key = f"test-cache-{uuid.uuid4().hex}"
    try:
        assert cache.add(key, {"n": 1}, timeout=30)
        assert not cache.add(key, {"n": 2}, timeout=30)
        assert cache.get(key) == {"n": 1}
        assert cache.add(f"{key}:count", 0, timeout=30)
        assert cache.incr(f"{key}:count") == 1
    finally:
        cache.delete_many([key, f"{key}:count"])
