"""A topic at the queue limit, remapped three times under load on real processes, reads back every acknowledged message.

Three meta nodes and three brokers on loopback. The brokers' route reader and meta's watch stream once failed on a
route this large, blinding every broker; this is the proof at QUEUES_PER_TOPIC_MAX.

The topic keeps one copy of each queue (``replicas: 1``): the proof here is of the route, the watch stream and remaps
at the limit. With the default three copies the same run took twice as long (its phases 84-88 s against 45 s,
2026-11-30): every change of the route reaches each broker as the whole 4 MB route, parsed and applied again in full
(py-spy: 60-80% of a broker's time in MetaLink._on_event while every queue took its first message), so each send
waits longer for its followers' acknowledgements. That cost, not replication's correctness (tests/test_replication_e2e.py),
is what the copies added; routes sent as changes, not whole, are the lever.

A route of this topic is megabytes, so the test keeps one copy and fetches it again only when a send finds it stale
(with a long poll, so waiting for the next version costs meta no renders), instead of once per request as the small
helpers in tests/support/broker_http.py do.
"""

from __future__ import annotations

import asyncio
import collections
import json
import time

import aiohttp
import pytest

from meta import limits
from tests.support import cluster as cluster_mod
from tests.support.broker_http import admin, all_writable
from tests.support.broker_http import send as send_following_routes

pytestmark = pytest.mark.slow

TOPIC = "max"
# The limit is the point. When it fails, add a smaller count here (1024 took 25 s) to tell load from a broken test:
# run in the suite as well, it only repeated the limit case's paths at a quarter of the size, for 25 s of a suite
# that must stay under 15 minutes on 2 cores.
QUEUE_COUNTS = (limits.QUEUES_PER_TOPIC_MAX,)
SAMPLE_QUEUES = 48                 # queues written continuously while the topic is remapped
PRODUCERS = 8                      # concurrent producer tasks over the sample
BATCH_MESSAGES = 4
CONCURRENT_REQUESTS = 48           # requests in flight while every queue is written or read
# Every queue onto one broker, then off it onto the two others; then queue 0 alone once more, so that its chain is
# longer than a route carries (a third remap of every queue took ~20 s of a suite that must stay under 15 minutes)
REMAPS = ((["b2"], None), (["b1", "b3"], None), (["b2"], [0]))
SETTLE_S_MAX = 150.0               # one remap of every queue until every queue is writable again
SEND_S_MAX = 120.0
LONG_POLL_S = 0.5
DIGEST_S_MAX = 30.0
READ_PAGE_MESSAGES = 1000


class RouteCache:
    """The topic's newest route known to the test, shared by every task; fetched again only when it is stale."""

    def __init__(self, c, topic: str):
        self.c = c
        self.topic = topic
        self.route: dict | None = None
        self.size_bytes = 0
        self._lock = asyncio.Lock()

    async def newer_than(self, version: int, wait_s: float = LONG_POLL_S) -> dict:
        """A route newer than ``version`` if one appears within ``wait_s``, else the newest known."""
        async with self._lock:  # one fetch serves every task that found the same version stale
            if self.route is None or self.route["version"] <= version:
                await self._fetch(version, wait_s)
            return self.route

    async def _fetch(self, after: int, wait_s: float) -> None:
        c = self.c
        url = (f"{c.meta_urls[0]}/v1/routes/{self.topic}?after={after}&wait={wait_s}"
               f"&min_version={c.extra.get('version', 0)}")
        async with c.session.get(url, headers=c.headers("client"),
                                 timeout=aiohttp.ClientTimeout(total=wait_s + 30)) as r:
            if r.status == 304:
                return
            raw = await r.read()
            assert r.status == 200, (r.status, raw[:300])
        route = json.loads(raw)
        if self.route is None or route["version"] > self.route["version"]:
            self.route, self.size_bytes = route, len(raw)

    async def settled(self, timeout_s: float) -> dict:
        """The route once every queue's head is writable again (the admin write's version at least)."""
        deadline = time.monotonic() + timeout_s
        r = await self.newer_than(self.c.extra.get("version", 0) - 1)
        while not all_writable(r):
            assert time.monotonic() < deadline, \
                f"{sum(not q['writable'] for q in r['queues'])} queues still not writable at version {r['version']}"
            r = await self.newer_than(r["version"])
        return r


async def send(routes: RouteCache, queue: int, bodies: list[str], unknown: list[list[str]]) -> list[int]:
    """tests/support/broker_http.py's send, following this test's shared route instead of reading a 3 MB route again.
    Bodies of attempts whose outcome is unknown (timed out under load, then retried) are added to ``unknown``."""
    async def newer(held: dict | None) -> dict:
        return routes.route if held is None else await routes.newer_than(held["version"])
    return await send_following_routes(routes.c, routes.topic, queue, bodies, SEND_S_MAX, newer, unknown)


async def read_queue(routes: RouteCache, queue: int) -> tuple[list[dict], int]:
    """Every message of the queue from offset 0, through its head broker, and the queue's max offset."""
    c = routes.c
    addr = routes.route["queues"][queue]["address"]
    out, offset = [], 0
    while True:
        s, b, _ = await c.call("GET", f"{addr}/v1/messages/{routes.topic}/{queue}?offset={offset}"
                                      f"&max={READ_PAGE_MESSAGES}", "client", timeout_s=30.0)
        assert s == 200, (queue, offset, s, b)
        out += b["messages"]
        assert b["next_offset"] > offset or b["next_offset"] >= b["max_offset"], (queue, offset, b)
        offset = b["next_offset"]
        if offset >= b["max_offset"]:
            return out, b["max_offset"]


async def each_queue(fn, queues) -> None:
    """Run ``fn(queue)`` for every queue, CONCURRENT_REQUESTS at a time."""
    it = iter(queues)

    async def worker():
        for q in it:
            await fn(q)
    await asyncio.gather(*(worker() for _ in range(CONCURRENT_REQUESTS)))


class Phases:
    """Wall time of each phase, printed at the end so a slow run says where its time went."""

    def __init__(self):
        self.t = time.monotonic()
        self.took: list[tuple[str, float]] = []

    def done(self, name: str) -> None:
        now = time.monotonic()
        self.took.append((name, now - self.t))
        print(f"[max-topic] {name}: {now - self.t:.1f} s", flush=True)
        self.t = now


@pytest.mark.long(seconds=80)   # its module alone, measured on 2 cores (tests/conftest.py)
@pytest.mark.timeout(600)
@pytest.mark.parametrize("queues", QUEUE_COUNTS)
async def test_a_topic_at_the_queue_limit_survives_three_remaps_under_load(tmp_path, queues):
    # KRaft's session defaults, not the short ones of tests/conftest.py: a lapse would fence a broker and turn the
    # graceful remaps this test is about into fenced ones, with offset jumps.
    async with cluster_mod.running(str(tmp_path), 3, 3, meta={
            "session_timeout_ms": limits.BROKER_SESSION_TIMEOUT_MS,
            "heartbeat_interval_ms": limits.BROKER_HEARTBEAT_INTERVAL_MS}) as c:
        await _remaps_under_load(c, queues)


async def _remaps_under_load(c, queues: int) -> None:
    phases = Phases()
    s, b = await admin(c, "POST", 0, "/v1/topics", json={"topic": TOPIC, "queues": queues, "slots": queues, "replicas": 1})
    assert s == 201, b
    routes = RouteCache(c, TOPIC)
    r = await routes.settled(SETTLE_S_MAX)
    assert len(r["queues"]) == queues
    epochs: dict[str, int] = {}
    await _no_broker_fenced(c, epochs)
    phases.done("create until every queue is writable")

    acked: dict[int, list[tuple[int, str]]] = {q: [] for q in range(queues)}
    # Sends are at least once: an attempt that timed out may have been stored before its retry was (every body is
    # unique, so such a copy is told apart from a broker storing one message twice or out of order).
    unknown: dict[int, list[list[str]]] = {q: [] for q in range(queues)}

    def send_one(tag: str):
        async def one(q: int):
            body = f"{tag}-{q}"
            acked[q] += zip(await send(routes, q, [body], unknown[q]), [body])
        return one

    await each_queue(send_one("before"), range(queues))
    phases.done("one message to every queue")

    sample = [i * queues // SAMPLE_QUEUES for i in range(SAMPLE_QUEUES)]
    stop = asyncio.Event()

    async def producer(mine: list[int]):
        i = 0
        while not stop.is_set():
            for q in mine:
                bodies = [f"p-{q}-{i + k}" for k in range(BATCH_MESSAGES)]
                acked[q] += zip(await send(routes, q, bodies, unknown[q]), bodies)
            i += BATCH_MESSAGES

    tasks = [asyncio.create_task(producer(sample[p::PRODUCERS])) for p in range(PRODUCERS)]
    try:
        for target, only in REMAPS:
            s, b = await admin(c, "POST", 1, f"/v1/topics/{TOPIC}/remap",
                               json={"brokers": target, **({"queues": only} if only else {})})
            assert s == 200, b
            assert b["moved"] and all(m["to"] in target for m in b["moved"]), b["moved"][:3]
            phases.done(f"remap onto {','.join(target)} accepted ({len(b['moved'])} queues move)")
            await routes.settled(SETTLE_S_MAX)
            phases.done(f"remap onto {','.join(target)} settled")
            await _replicas_agree(c)
            await _no_broker_fenced(c, epochs)
            phases.done("replicas compared, sessions checked")
    finally:
        stop.set()
        await asyncio.gather(*tasks)
    produced = sum(len(acked[q]) for q in sample)
    phases.done(f"producers stopped ({produced} messages to {SAMPLE_QUEUES} queues)")

    await each_queue(send_one("after"), range(queues))
    phases.done("one more message to every queue")

    r = await routes.newer_than(routes.route["version"], wait_s=0)
    assert max(len(q["segments"]) for q in r["queues"]) <= limits.ROUTE_SEGMENTS_PER_QUEUE_MAX, \
        "a route carries only the newest segments of each queue"
    assert routes.size_bytes <= limits.ROUTE_BYTES_MAX, routes.size_bytes
    assert {q["broker"] for q in r["queues"][1:]} == set(REMAPS[1][0]) and r["queues"][0]["broker"] == "b2"
    moved_thrice = r["queues"][0]
    assert moved_thrice["gen"] == len(REMAPS), moved_thrice
    await _whole_chain(c, moved_thrice)

    async def check(q: int):
        got, max_offset = await read_queue(routes, q)
        offsets = [m["offset"] for m in got]
        # the jumps alone: after a budget seal the whole range is a million offsets, and its diff took minutes in CI
        jumps = [(a, b) for a, b in zip([-1, *offsets], [*offsets, max_offset]) if b != a + 1]
        assert not jumps, f"queue {q}: offsets not continuous from 0 to {max_offset}: (before, after) {jumps[:5]}"
        stored = [(m["offset"], m["body"]) for m in got]
        unacked = [x for x in stored if x not in set(acked[q])]
        assert [x for x in stored if x not in unacked] == acked[q], \
            f"queue {q}: not every acknowledged message, once, in order"
        may_be_stored = collections.Counter(b for attempt in unknown[q] for b in attempt)
        assert not collections.Counter(b for _, b in unacked) - may_be_stored, \
            f"queue {q}: stored messages no send left in doubt: {unacked} (in doubt: {unknown[q]})"
    await _no_broker_fenced(c, epochs)   # a lapse since the last remap: the jumps below would be its consequence
    await each_queue(check, range(queues))
    phases.done("every queue read back")
    print(f"[max-topic] route {routes.size_bytes} bytes; total {sum(t for _, t in phases.took):.1f} s", flush=True)


async def _whole_chain(c, head: dict) -> None:
    """GET .../segments returns every generation of a queue, contiguous in logic offsets, ending at the route's head,
    although the route itself carries only the newest ROUTE_SEGMENTS_PER_QUEUE_MAX of them."""
    q = head["queue"]
    s, b, _ = await c.call("GET", f"{c.meta_urls[2]}/v1/topics/{TOPIC}/queues/{q}/segments"
                                  f"?min_version={c.extra['version']}", "client")
    assert s == 200, b
    chain = b["segments"]
    assert [x["gen"] for x in chain] == list(range(len(REMAPS) + 1)), chain
    assert len(head["segments"]) == limits.ROUTE_SEGMENTS_PER_QUEUE_MAX < len(chain)
    assert chain[0]["logic_start"] == 0
    assert all(a["logic_end"] == n["logic_start"] for a, n in zip(chain, chain[1:])), chain
    assert [x["state"] for x in chain] == ["sealed"] * len(REMAPS) + ["active"], chain
    assert chain[-1]["physical_queue"] == head["physical_queue"]


async def _replicas_agree(c) -> None:
    """DESIGN.md invariant 1 under this load: once the nodes have applied the same commands, their images are the
    same bytes (a replica that applied entries the log later replaced would differ)."""
    deadline = time.monotonic() + DIGEST_S_MAX
    while True:
        digests = []
        for url in c.meta_urls:
            s, b, _ = await c.call("GET", f"{url}/v1/admin/image-digest?min_version={c.extra['version']}",
                                   timeout_s=DIGEST_S_MAX)
            assert s == 200, b
            digests.append(b)
        if len({d["commands"] for d in digests}) == 1:
            break
        assert time.monotonic() < deadline, f"the nodes never applied the same commands: {digests}"
        await asyncio.sleep(0.2)
    assert len({d["sha256"] for d in digests}) == 1, f"replicas diverged: {digests}"


async def _no_broker_fenced(c, epochs: dict[str, int]) -> None:
    """A fenced broker's segments are sealed without its report, so the next generation starts after a jump: the
    remaps here must complete by the brokers' own seal reports, with every session alive throughout. A broker fenced
    and back already is active again, with a new epoch: ``epochs`` holds each broker's first."""
    s, b, _ = await c.call("GET", f"{c.meta_urls[0]}/v1/brokers?min_version={c.extra['version']}", "client")
    assert s == 200, b
    assert all(x["state"] == "active" for x in b["brokers"]), f"a broker's session lapsed: {b['brokers']}"
    for x in b["brokers"]:
        assert epochs.setdefault(x["broker"], x["epoch"]) == x["epoch"], f"a broker's session lapsed: {x}"
