"""The route cache is bounded by bytes and evicts the least recently used route first; big routes go gzip'd."""

import asyncio
import gzip
import json

import aiohttp

from meta.route_cache import RouteCache
from wire.sse import SseParser
from tests.support import cluster as cluster_mod
from tests.support.meta_http import snapshot_or_none, wait_until
from tests.support.metrics import scrape, value

WARM_WAIT_S = 30.0
STALE_TOPICS = 150   # big topics whose routes a restarted node restores stale (~1 s of renders)


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


async def test_a_big_route_goes_gzipd_to_readers_that_take_it_and_as_is_to_the_rest(tmp_path):
    """A 200-queue route is gzip'd once per version for a reader sending Accept-Encoding: gzip, and is the same JSON
    once unpacked; a small route, or a reader without gzip, gets the rendered bytes; a change is never served stale."""
    async with cluster_mod.running(str(tmp_path), 3, 0, meta={"session_timeout_ms": 600_000}) as c:
        m = c.meta_urls[0]
        s, b, _ = await c.call("PUT", m + "/v1/brokers/b1", "broker", json={"address": "http://127.0.0.1:1"})
        assert s == 200, b
        for topic, queues in (("big", 200), ("small", 2)):
            s, b, _ = await c.call("POST", m + "/v1/topics", json={"topic": topic, "queues": queues})
            assert s == 201, b
        auth = c.headers("client")
        async with aiohttp.ClientSession(auto_decompress=False) as raw:
            async def get(topic: str, encoding: str) -> tuple[str | None, dict]:
                async with raw.get(f"{m}/v1/routes/{topic}", headers={**auth, "Accept-Encoding": encoding}) as r:
                    assert r.status == 200
                    body = await r.read()
                    coding = r.headers.get("Content-Encoding")
                    return coding, json.loads(gzip.decompress(body) if coding == "gzip" else body)

            coding, packed = await get("big", "gzip, deflate")
            assert coding == "gzip"
            assert await get("big", "identity") == (None, packed)
            assert (await get("small", "gzip"))[0] is None
            for i in range(2):   # each version's gzip is its own: the cache never answers an older one
                s, b, _ = await c.call("PUT", m + "/v1/topics/big/config", json={"n": str(i)})
                assert s == 200, b
                coding, packed = await get("big", "gzip")
                assert coding == "gzip" and packed["version"] == b["version"] and packed["config"]["n"] == str(i)


async def test_a_big_topics_route_is_rendered_and_gzipd_as_it_changes_before_anyone_reads_it(tmp_path):
    async with cluster_mod.running(str(tmp_path), 3, 0, meta={"session_timeout_ms": 600_000}) as c:
        m = c.meta_urls[0]
        s, b, _ = await c.call("PUT", m + "/v1/brokers/b1", "broker", json={"address": "http://127.0.0.1:1"})
        assert s == 200, b

        async def warmed() -> tuple[float, float]:
            samples = await scrape(c.session, m)
            return value(samples, "stator_meta_routes_prerendered_total"), value(
                samples, "stator_meta_route_cache_bytes", form="gzip")
        assert await warmed() == (0, 0)
        s, b, _ = await c.call("POST", m + "/v1/topics", json={"topic": "small", "queues": 2})
        assert s == 201, b
        s, b, _ = await c.call("POST", m + "/v1/topics", json={"topic": "big", "queues": 200})
        assert s == 201, b
        first = await wait_until(lambda: _at_least(warmed, 1), WARM_WAIT_S, "the big route to be prerendered")
        assert first[1] > 0
        s, b, _ = await c.call("PUT", m + "/v1/topics/big/config", json={"n": "1"})
        assert s == 200, b
        await wait_until(lambda: _at_least(warmed, first[0] + 1), WARM_WAIT_S, "the changed route to be prerendered")
        s, b, _ = await c.call("PUT", m + "/v1/topics/small/config", json={"n": "1"})
        assert s == 200, b
        await asyncio.sleep(1.0)   # a small topic's change is left to its readers
        assert (await warmed())[0] == first[0] + 1
        # Prerendering keeps the gzip'd form only: the rendered cache is for readers without gzip.
        assert value(await scrape(c.session, m), "stator_meta_route_cache_bytes", form="rendered") == 0


async def test_a_node_restarted_on_its_snapshot_prerenders_each_big_route_once_and_serves_reads_at_once(tmp_path):
    fast_compaction = {"compaction_min_entries": 20, "compaction_min_time_s": 1}
    async with cluster_mod.running(str(tmp_path), 3, 0, meta={"session_timeout_ms": 600_000,
                                                              "raft_tuning": fast_compaction}) as c:
        leader = await c.leader()
        lead_url = c.url(leader)
        follower = next(m["node"] for m in c.info["meta"] if m["node"] != leader)
        s, b, _ = await c.call("PUT", lead_url + "/v1/brokers/b1", "broker", json={"address": "http://127.0.0.1:1"})
        assert s == 200, b
        s, b, _ = await c.call("POST", lead_url + "/v1/topics", json={"topic": "big", "queues": 200})
        assert s == 201, b
        s, b, _ = await c.call("POST", lead_url + "/v1/topics", json={"topic": "small", "queues": 2})
        assert s == 201, b
        snapshot_path = f"{c.dir}/{follower}/data/raft.snapshot"

        async def snapshot_holds_big():
            # Writes to the small topic only: entries replayed after the snapshot never change the big route.
            s, b, _ = await c.call("PUT", lead_url + "/v1/topics/small/config",
                                   json={"n": str(asyncio.get_running_loop().time())})
            assert s == 200, b
            snap = snapshot_or_none(snapshot_path)
            return snap if snap is not None and "big" in snap.image["topics"] else None
        await wait_until(snapshot_holds_big, WARM_WAIT_S, "a snapshot on the follower that holds the big topic")
        s, b, _ = await c.call("GET", lead_url + "/v1/topics/small")
        version = b["version"]
        c.kill9(follower)
        c.start(follower)
        url = c.url(follower)
        # Ready only with its routes warm (meta/route_warmer.py): never a ready answer before the warm-up.
        answers = []

        async def ready():   # a refused connection while it starts: wait_until asks again
            s, b, _ = await c.call("GET", url + "/readyz", None, timeout_s=2.0)
            answers.append((s, b))
            return b if s == 200 else None
        assert (await wait_until(ready, WARM_WAIT_S, "the restarted node to be ready", interval_s=0.02))["routes_warm"]
        assert all(b["routes_warm"] for s, b in answers if s == 200 or b["ready"]), answers
        # Reads that name the version the node restored are answered at once, not after the next write.
        s, b, _ = await c.call("GET", url + f"/v1/routes/big?min_version={version}&wait=2")
        assert s == 200, b
        assert b["version"] <= version
        # A watch stream resumed from before the snapshot gets every topic changed since: the node's change log
        # starts at the restored version, so it scans everything rather than finding nothing.
        assert await _watched_topics(c, url, after=1, want={"big", "small"}) >= {"big", "small"}

        async def prerendered() -> float | None:
            n = value(await scrape(c.session, url), "stator_meta_routes_prerendered_total")
            return n if n >= 1 else None
        assert await wait_until(prerendered, WARM_WAIT_S, "the big route to be prerendered after the restart") == 1
        await asyncio.sleep(3.0)   # past the warmer's settle window: a second pass would have run by now
        assert await prerendered() == 1


async def test_a_node_back_after_its_big_routes_changed_is_ready_only_once_it_applied_and_rendered_them(tmp_path):
    """The routes it restored are stale: it is ready only once its image holds what the leader had committed (Log.is_ready)
    and its warm-up rendered them again (meta/service.py ready). Before, it said ready with its image 250 versions
    behind and its routes those of its own journal."""
    async with cluster_mod.running(str(tmp_path), 3, 0, meta={"session_timeout_ms": 600_000}) as c:
        leader = await c.leader()
        lead_url = c.url(leader)
        follower = next(m["node"] for m in c.info["meta"] if m["node"] != leader)
        s, b, _ = await c.call("PUT", lead_url + "/v1/brokers/b1", "broker", json={"address": "http://127.0.0.1:1"})
        assert s == 200, b
        topics = [f"big{i}" for i in range(STALE_TOPICS)]
        for t in topics:
            s, b, _ = await c.call("POST", lead_url + "/v1/topics", json={"topic": t, "queues": 1000})
            assert s == 201, b
        c.kill9(follower)
        for t in topics:   # each big route the follower restores is now stale
            s, b, _ = await c.call("PUT", lead_url + f"/v1/topics/{t}/config", json={"changed": "yes"})
            assert s == 200, b
        version = b["version"]
        c.start(follower)
        url = c.url(follower)
        answers = []

        async def ready():
            s, b, _ = await c.call("GET", url + "/readyz", None, timeout_s=2.0)
            answers.append((s, b))
            return b if s == 200 else None
        first = await wait_until(ready, WARM_WAIT_S, "the restarted node to be ready", interval_s=0.01)
        assert first["routes_warm"] and first["applied_version"] >= version, first
        assert all(b["routes_warm"] for s, b in answers if s == 200 or b["ready"]), \
            [b for s, b in answers if s == 200 or b["ready"]][:3]
        s, b, _ = await c.call("GET", url + f"/v1/routes/{topics[-1]}")
        assert s == 200 and b["config"] == {"changed": "yes"}, b


async def _watched_topics(c, url: str, after: int, want: set[str], timeout_s: float = 10.0) -> set[str]:
    """The topics a node's all-topic watch stream sends after ``after``: once ``want`` is among them, or all it sent
    within ``timeout_s``."""
    parser, topics = SseParser(), set()
    try:
        async with asyncio.timeout(timeout_s):
            async with c.session.get(f"{url}/v1/watch?after={after}", headers=c.headers("client")) as resp:
                assert resp.status == 200
                async for chunk in resp.content.iter_any():
                    topics |= {json.loads(e.data)["topic"] for e in parser.feed(chunk) if e.event == "route"}
                    if want <= topics:
                        break
    except TimeoutError:
        pass
    return topics


async def _at_least(warmed, n: float):
    got = await warmed()
    return got if got[0] >= n else None
