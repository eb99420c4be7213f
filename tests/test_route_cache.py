"""The route cache is bounded by bytes and evicts the least recently used route first."""

from meta.route_cache import RouteCache


def test_route_cache_keeps_within_its_byte_bound_evicting_least_recently_used():
    cache = RouteCache(bytes_max=250)
    cache.put("a", 1, b"x" * 100)
    cache.put("b", 1, b"y" * 100)
    assert cache.get("a", 1) == b"x" * 100          # a is now the most recently used
    cache.put("c", 1, b"z" * 100)                   # 300 bytes > 250: b goes
    assert cache.get("b", 1) is None
    assert cache.get("a", 1) is not None and cache.get("c", 1) is not None
    assert cache.bytes == 200


def test_route_cache_serves_only_the_current_version():
    cache = RouteCache(bytes_max=1000)
    cache.put("a", 1, b"old")
    assert cache.get("a", 2) is None
    cache.put("a", 2, b"new")
    assert cache.get("a", 2) == b"new" and cache.bytes == 3
    cache.drop("a")
    assert cache.get("a", 2) is None and cache.bytes == 0
