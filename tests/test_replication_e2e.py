"""Every acknowledged message on more than one disk (DESIGN.md invariant 12), on real processes: three brokers, a
topic of three copies, keyed sends under load; a broker is killed with kill -9 and its data directory removed (a
dead disk). Nothing acknowledged is lost, every queue takes writes again within the session timeout and 2 s with no
operator command, and the wiped broker comes back, catches up and is in sync again."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import time

import aiohttp

from ops import devcluster

from tests.support.broker_http import admin, read_all, route, send, wait_route
from tests.support.cluster import running
from tests.support.metrics import scrape, value

SESSION_TIMEOUT_MS = 3_000
QUEUES = 3
SENDERS_PER_QUEUE = 2
BATCH = 5


async def _sender(c, topic: str, queue: int, n: int, acked: dict, unknown: list, stop: asyncio.Event,
                  writable_again: dict, killed_at: list) -> None:
    """Sends batches of keyed bodies to the queue's head, following the route on any refusal; records each
    acknowledged body at its offset, and each attempt whose outcome it cannot know."""
    i = 0
    r = await route(c, topic)
    while not stop.is_set():
        bodies = [f"q{queue}-s{n}-{i}-{j}" for j in range(BATCH)]
        i += 1
        while not stop.is_set():
            q = r["queues"][queue]
            try:
                s, b, _ = await c.call("POST", f"{q['address']}/v1/messages/{topic}/{queue}", "client",
                                       json={"messages": [{"body": x, "key": x} for x in bodies]}, timeout_s=5.0)
            except (aiohttp.ClientError, asyncio.TimeoutError):
                unknown.extend(bodies)   # it may have been stored: a resend may store it twice
                s, b = None, None
            if s == 200:
                for off, body in zip(b["offsets"], bodies):
                    acked[(queue, off)] = body
                if killed_at and queue not in writable_again:
                    writable_again[queue] = time.monotonic() - killed_at[0]
                break
            assert s in (None, 409, 503), (s, b)
            if s == 503 and b["error"]["code"] == "REPLICATION_UNCONFIRMED":
                unknown.extend(bodies)   # stored maybe, never acknowledged
            await asyncio.sleep(0.02)
            r = await route(c, topic)


async def test_a_broker_lost_with_its_disk_loses_no_acknowledged_message_and_its_queues_fail_over(tmp_path):
    extra_meta = {"session_timeout_ms": SESSION_TIMEOUT_MS, "heartbeat_interval_ms": 500}
    async with running(str(tmp_path), 3, 3, meta=extra_meta) as c:
        s, b = await admin(c, "POST", 0, "/v1/topics", {"topic": "r", "queues": QUEUES, "replicas": 3})
        assert s == 201 and (b["replicas"], b["min_insync"]) == (3, 2), b
        r = await wait_route(c, "r", lambda r: all(len(q["in_sync"]) == 3 and q["writable"] for q in r["queues"]))
        victim = r["queues"][0]["broker"]   # leads queue 0 at least

        acked: dict[tuple[int, int], str] = {}
        unknown: list[str] = []
        stop = asyncio.Event()
        writable_again: dict[int, float] = {}
        killed_at: list[float] = []
        senders = [asyncio.create_task(_sender(c, "r", q, n, acked, unknown, stop, writable_again, killed_at))
                   for q in range(QUEUES) for n in range(SENDERS_PER_QUEUE)]
        await asyncio.sleep(2.0)
        assert len(acked) > 0 and all(not t.done() for t in senders)

        c.kill9(victim)
        killed_at.append(time.monotonic())
        shutil.rmtree(os.path.join(c.dir, victim, "data"))
        before_kill = len(acked)
        deadline = time.monotonic() + SESSION_TIMEOUT_MS / 1000 + 2.0 + 10.0
        while len(writable_again) < QUEUES and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)
        stop.set()
        await asyncio.gather(*senders)
        led = [q for q in range(QUEUES) if r["queues"][q]["broker"] == victim]
        assert sorted(writable_again) == list(range(QUEUES)), (writable_again, led)
        # the queues the victim led took writes again within the session timeout + 2 s, with no operator command
        for q in led:
            assert writable_again[q] <= SESSION_TIMEOUT_MS / 1000 + 2.0, (q, writable_again)
        assert len(acked) > before_kill
        print(f"\n[failover] {victim} killed and wiped; queues {led} led by it took writes again after "
              f"{[round(writable_again[q], 2) for q in led]} s (bound {SESSION_TIMEOUT_MS / 1000 + 2.0} s); "
              f"{len(acked)} messages acknowledged, {len(unknown)} sent with no known outcome")

        # 0 acknowledged messages lost: each is at its offset, read from each queue's new head
        after = await route(c, "r")
        assert all(q["broker"] != victim for q in after["queues"])
        for q in range(QUEUES):
            messages = await read_all(c, "r", q)
            at = {m["offset"]: m["body"] for m in messages}
            offsets = [m["offset"] for m in messages]
            assert offsets == list(range(offsets[0], offsets[0] + len(offsets))), "offsets are not contiguous"
            for (queue, off), body in acked.items():
                if queue == q:
                    assert at.get(off) == body, (q, off, body, at.get(off))
            seen: dict[str, int] = {}
            for m in messages:
                seen[m["body"]] = seen.get(m["body"], 0) + 1
            twice = {b for b, n in seen.items() if n > 1}
            assert twice <= set(unknown), "a body stored twice that was never sent twice"

        # the wiped broker comes back, catches up from the leaders and is in sync again
        c.start(victim)
        await wait_route(c, "r", lambda r: all(victim in q["in_sync"] for q in r["queues"]), timeout_s=60.0)
        # led by it again, every queue reads whole from it: the segments it led before its disk was lost come from
        # whichever broker holds them whole, never from its own empty copy as if they had ended
        s, b = await admin(c, "POST", 0, "/v1/topics/r/remap", {"brokers": [victim]})
        assert s == 200, b
        await wait_route(c, "r", lambda r: all(q["broker"] == victim and q["writable"] for q in r["queues"]))
        for q in range(QUEUES):
            at = {m["offset"]: m["body"] for m in await read_all(c, "r", q)}
            assert all(at.get(off) == body for (queue, off), body in acked.items() if queue == q), q


async def test_a_send_is_acknowledged_and_read_only_once_every_in_sync_copy_holds_it(tmp_path):
    async with running(str(tmp_path), 3, 3) as c:
        s, b = await admin(c, "POST", 0, "/v1/topics", {"topic": "r", "queues": 1, "replicas": 3})
        assert s == 201, b
        r = await wait_route(c, "r", lambda r: len(r["queues"][0]["in_sync"]) == 3 and r["queues"][0]["writable"])
        q = r["queues"][0]
        url = f"{q['address']}/v1/messages/r/0"
        s, b, _ = await c.call("POST", url, "client", json={"messages": [{"body": "first"}]})
        assert (s, b["offsets"]) == (200, [0]), b
        followers = [f for f in q["replicas"] if f != q["broker"]]
        for f in followers:
            os.kill(c.pid(f), signal.SIGSTOP)   # alive, registered, in sync, but taking nothing
        try:
            send = asyncio.create_task(c.call("POST", url, "client", json={"messages": [{"body": "second"}]},
                                              timeout_s=30.0))
            await asyncio.sleep(1.5)
            assert not send.done(), f"acknowledged before any copy held it: {send.result()[:2]}"
            s, b, _ = await c.call("GET", f"{url}?offset=0&max=10", "client")
            assert s == 200 and [m["body"] for m in b["messages"]] == ["first"] and b["max_offset"] == 1, b
        finally:
            for f in followers:
                os.kill(c.pid(f), signal.SIGCONT)
        s, b, _ = await send
        assert (s, b["offsets"]) == (200, [1]), b
        s, b, _ = await c.call("GET", f"{url}?offset=0&max=10", "client")
        assert [m["body"] for m in b["messages"]] == ["first", "second"], b
        # Where the leader's time went shows in its metrics: the second send waited the copies' pause out after
        # its own sync; each copy acknowledged what it took.
        async with aiohttp.ClientSession() as http:
            leader = await scrape(http, q["address"])
            assert value(leader, "stator_broker_copies_wait_seconds_count") == 2
            assert value(leader, "stator_broker_copies_wait_seconds_sum") >= 1.5
            for f in followers:
                copy = await scrape(http, c.url(f))
                assert value(copy, "stator_broker_copy_acknowledge_seconds_count") >= 1
                assert value(copy, "stator_broker_copies_wait_seconds_count") == 0   # it led nothing


async def test_a_resent_batch_is_stored_once_by_its_leader_and_by_the_replica_elected_after_it(tmp_path):
    """An idempotent producer's batch sent again (same X-Producer-Id and X-Producer-Seq) is answered with the offsets
    it was stored at and not stored again: at the same leader, and at the copy elected when that leader dies."""
    extra_meta = {"session_timeout_ms": SESSION_TIMEOUT_MS, "heartbeat_interval_ms": 500}
    async with running(str(tmp_path), 3, 3, meta=extra_meta) as c:
        s, b = await admin(c, "POST", 0, "/v1/topics", {"topic": "r", "queues": 1, "replicas": 3})
        assert s == 201, b
        r = await wait_route(c, "r", lambda r: len(r["queues"][0]["in_sync"]) == 3 and r["queues"][0]["writable"])

        async def send(address: str, seq: int, bodies: list[str], version: int = 0) -> tuple[int, dict]:
            s, b, _ = await c.call("POST", f"{address}/v1/messages/r/0", "client",
                                   json={"messages": [{"body": x} for x in bodies]},
                                   headers={"X-Producer-Id": "77", "X-Producer-Seq": str(seq),
                                            "X-Route-Version": str(version)})   # the route the sender read
            return s, b

        leader = r["queues"][0]
        assert await send(leader["address"], 0, ["a", "b"]) == (200, {"queue": 0, "offsets": [0, 1]})
        assert await send(leader["address"], 1, ["c"]) == (200, {"queue": 0, "offsets": [2]})
        assert await send(leader["address"], 0, ["a", "b"]) == (200, {"queue": 0, "offsets": [0, 1]})
        s, b, _ = await c.call("POST", f"{leader['address']}/v1/messages/r/0", "client",
                               json={"messages": [{"body": "x"}]}, headers={"X-Producer-Id": "77"})
        assert s == 400 and b["error"]["code"] == "INVALID_ARGUMENT", b

        c.kill9(leader["broker"])
        r = await wait_route(c, "r", lambda r: r["queues"][0]["broker"] != leader["broker"]
                             and r["queues"][0]["writable"], timeout_s=SESSION_TIMEOUT_MS / 1000 + 10)
        new = r["queues"][0]["address"]
        assert await send(new, 1, ["c"], r["version"]) == (200, {"queue": 0, "offsets": [2]}), \
            "the resend was stored again"
        assert await send(new, 2, ["d"]) == (200, {"queue": 0, "offsets": [3]})
        assert [m["body"] for m in await read_all(c, "r", 0)] == ["a", "b", "c", "d"]


async def test_copies_lost_one_after_another_come_back_from_whichever_broker_still_holds_them(tmp_path):
    """Found by the chaos runner's broker_wipe: the leader's disk is lost, then the disk of the copy elected in its
    place; the two come back on empty disks and must fetch the first segment from the one broker that still holds
    it (asking only its sealer and its leader, both empty now, they never got it). Then that broker's disk is lost
    too, and nothing acknowledged may be missing."""
    extra_meta = {"session_timeout_ms": SESSION_TIMEOUT_MS, "heartbeat_interval_ms": 500}
    async with running(str(tmp_path), 3, 3, meta=extra_meta) as c:
        s, b = await admin(c, "POST", 0, "/v1/topics", {"topic": "r", "queues": 1, "replicas": 3, "min_insync": 1})
        assert s == 201, b
        r = await wait_route(c, "r", lambda r: len(r["queues"][0]["in_sync"]) == 3 and r["queues"][0]["writable"])
        first, second, third = r["queues"][0]["replicas"]
        bodies = [f"m{i}" for i in range(20)]
        s, b, _ = await c.call("POST", f"{r['queues'][0]['address']}/v1/messages/r/0", "client",
                               json={"messages": [{"body": x} for x in bodies]},
                               headers={"X-Route-Version": str(r["version"])})
        assert s == 200 and b["offsets"] == list(range(20)), b

        def lose(broker: str) -> None:
            c.kill9(broker)
            shutil.rmtree(os.path.join(c.dir, broker, "data"))

        lose(first)
        await wait_route(c, "r", lambda r: r["queues"][0]["broker"] == second and r["queues"][0]["writable"],
                         timeout_s=SESSION_TIMEOUT_MS / 1000 + 10)
        lose(second)
        await wait_route(c, "r", lambda r: r["queues"][0]["broker"] == third and r["queues"][0]["writable"],
                         timeout_s=SESSION_TIMEOUT_MS / 1000 + 10)
        c.start(first)
        c.start(second)
        await wait_route(c, "r", lambda r: set(r["queues"][0]["in_sync"]) == {first, second, third}, timeout_s=60)
        gen0 = f"r.q0.g0.i{int(r['queues'][0]['physical_queue'].rsplit('.i', 1)[1])}"
        for broker in (first, second):   # each fetched the first segment from the third, the one that held it
            deadline = time.monotonic() + 30
            while True:
                s, b, _ = await c.call("GET", f"{c.url(broker)}/v1/physical/{gen0}?offset=0&max=0", "broker")
                if s == 200 and b["max_offset"] >= 20:
                    break
                assert time.monotonic() < deadline, (broker, s, b)
                await asyncio.sleep(0.2)
        s, b = await admin(c, "POST", 0, "/v1/topics/r/remap", {"brokers": [first]})
        assert s == 200, b
        await wait_route(c, "r", lambda r: r["queues"][0]["broker"] == first and r["queues"][0]["writable"])
        lose(third)
        assert [m["body"] for m in await read_all(c, "r", 0)] == bodies


async def test_a_killed_leader_is_fenced_when_its_address_refuses_connections_long_before_its_session_ends(tmp_path):
    """The followers' fetches from a killed leader break off; they tell meta (POST /v1/brokers/{b}/peer-down), whose
    leader probes the broker's address and fences it at once when nothing listens there. A paused broker still
    accepts connections (its kernel does): the probe decides nothing and only its session's timeout may fence it."""
    session_s = 30.0
    async with running(str(tmp_path), 3, 3, meta={"session_timeout_ms": int(session_s * 1000),
                                                   "heartbeat_interval_ms": 1_000}) as c:
        s, b = await admin(c, "POST", 0, "/v1/topics", {"topic": "r", "queues": QUEUES, "replicas": 3})
        assert s == 201, b
        r = await wait_route(c, "r", lambda r: all(len(q["in_sync"]) == 3 and q["writable"] for q in r["queues"]))
        victim = r["queues"][0]["broker"]
        reporter = next(b for b in r["queues"][0]["in_sync"] if b != victim)
        s, listed, _ = await c.call("GET", c.meta_urls[0] + "/v1/brokers", "client")
        epoch = next(b["epoch"] for b in listed["brokers"] if b["broker"] == reporter)

        os.kill(c.pid(victim), signal.SIGSTOP)
        try:
            s, b, _ = await c.call("POST", f"{c.meta_urls[1]}/v1/brokers/{reporter}/peer-down", "broker",
                                   json={"epoch": epoch, "peer": victim})
            assert (s, b) == (200, {"peer": victim, "probe": "answered", "state": "active"}), (s, b)
        finally:
            os.kill(c.pid(victim), signal.SIGCONT)
        s, b, _ = await c.call("POST", f"{c.meta_urls[0]}/v1/brokers/{reporter}/peer-down", "broker",
                               json={"epoch": epoch + 1, "peer": victim})
        assert s == 409 and b["error"]["code"] == "STALE_EPOCH", (s, b)

        killed_at = time.monotonic()
        c.kill9(victim)   # returns once the process is gone: the clock starts before
        await wait_route(c, "r", lambda r: all(q["broker"] != victim and q["writable"] for q in r["queues"]),
                         timeout_s=session_s / 2)
        took = time.monotonic() - killed_at
        s, listed, _ = await c.call("GET", c.meta_urls[0] + "/v1/brokers", "client")
        assert next(b["state"] for b in listed["brokers"] if b["broker"] == victim) == "fenced"
        assert took < session_s / 2, took


async def test_a_broker_back_on_a_new_disk_catches_up_sealed_segments_older_than_its_routes_name(tmp_path):
    """Found by the chaos runner's broker_wipe (seed 11): a route names only each queue's newest segments
    (ROUTE_SEGMENTS_PER_QUEUE_MAX), so a broker back on a new disk caught up only those; the older ones stayed on
    the other copies alone, and two more lost disks lost them. It asks meta for every sealed copy it holds
    (GET /v1/brokers/{b}/copies) and catches each up."""
    from meta.limits import ROUTE_SEGMENTS_PER_QUEUE_MAX
    extra_meta = {"session_timeout_ms": SESSION_TIMEOUT_MS, "heartbeat_interval_ms": 500}
    async with running(str(tmp_path), 3, 3, meta=extra_meta) as c:
        s, b = await admin(c, "POST", 0, "/v1/topics", {"topic": "r", "queues": 1, "replicas": 3, "min_insync": 1})
        assert s == 201, b
        r = await wait_route(c, "r", lambda r: len(r["queues"][0]["in_sync"]) == 3 and r["queues"][0]["writable"])
        brokers = sorted(r["queues"][0]["replicas"])
        sealed: list[tuple[str, int]] = []   # (physical queue, records) of each segment sealed
        for gen in range(ROUTE_SEGMENTS_PER_QUEUE_MAX + 2):
            q = r["queues"][0]
            # meta's route is writable before the new head's broker has read it: follow SEALING as a producer does
            await send(c, "r", 0, [f"g{gen}-{i}" for i in range(5)])
            sealed.append((q["physical_queue"], 5))
            onto = brokers[(brokers.index(q["broker"]) + 1) % len(brokers)]
            s, b = await admin(c, "POST", 0, "/v1/topics/r/remap", {"brokers": [onto]})
            assert s == 200, b
            r = await wait_route(c, "r", lambda r: r["queues"][0]["gen"] == gen + 1 and r["queues"][0]["writable"]
                                 and len(r["queues"][0]["in_sync"]) == 3)
        oldest = sealed[0][0]
        assert all(s["physical_queue"] != oldest for s in r["queues"][0]["segments"]), "the route still names it"

        lost = brokers[0]
        c.kill9(lost)
        shutil.rmtree(os.path.join(c.dir, lost, "data"))
        c.start(lost)
        for pq, n in sealed:   # every sealed copy, the oldest ones too, whole again on the new disk
            deadline = time.monotonic() + 60
            while True:
                s, b, _ = await c.call("GET", f"{c.url(lost)}/v1/physical/{pq}?offset=0&max=0", "broker")
                if s == 200 and b["max_offset"] >= n:
                    break
                assert time.monotonic() < deadline, (pq, s, b)
                await asyncio.sleep(0.2)
        # the other two disks go: what was acknowledged in the oldest segments is read from the one left
        for other in brokers[1:]:
            c.kill9(other)
        for gen, (pq, n) in enumerate(sealed):
            s, b, _ = await c.call("GET", f"{c.url(lost)}/v1/physical/{pq}?offset=0&max={n}", "broker")
            assert s == 200 and [m["payload"]["body"] for m in b["records"]] == [f"g{gen}-{i}" for i in range(n)], \
                (pq, b)


async def _epochs(c) -> dict[str, int]:
    s, b, _ = await c.call("GET", c.meta_urls[0] + "/v1/brokers", "client")
    assert s == 200, b
    return {x["broker"]: x["epoch"] for x in b["brokers"]}


async def test_a_leader_back_on_its_disk_leads_on_and_a_follower_back_on_a_new_disk_seals_nothing(tmp_path):
    """Found by the chaos runner (seed 21): every meta node down for 8 s; meanwhile a queue's leader lost power (its
    disk kept) and its only in-sync follower lost its disk. Meta, back, took the leader's registration as a lost
    disk and elected the follower (in sync and active in the image); the follower then registered from its empty
    disk, the only copy left in sync, and sealed the old gen at its end: acknowledged records were gone. Brokers
    now register with their data directory's id: the leader kept its disk, so it leads on."""
    # Long sessions, and a follower that leads nothing (no peer reports it down): meta, back, still counts it active
    # when the leader registers again, as in the chaos run
    extra_meta = {"session_timeout_ms": 30_000, "heartbeat_interval_ms": 500}
    async with running(str(tmp_path), 3, 3, meta=extra_meta) as c:
        s, b = await admin(c, "POST", 0, "/v1/topics", {"topic": "r", "queues": QUEUES, "replicas": 2,
                                                         "min_insync": 1, "brokers": ["b1"]})
        assert s == 201, b
        r = await wait_route(c, "r", lambda r: all(len(q["in_sync"]) == 2 and q["writable"] for q in r["queues"]))
        kept, wiped = r["queues"][0]["replicas"]
        acked: dict[tuple[int, int], str] = {}
        for i in range(10):
            for q in range(QUEUES):
                head = r["queues"][q]
                bodies = [f"q{q}-{i}-{j}" for j in range(BATCH)]
                s, b, _ = await c.call("POST", f"{head['address']}/v1/messages/r/{q}", "client",
                                       json={"messages": [{"body": x} for x in bodies]},
                                       headers={"X-Route-Version": str(r["version"])})
                assert s == 200, b
                acked.update({(q, off): body for off, body in zip(b["offsets"], bodies)})
        before = await _epochs(c)

        metas = [m["node"] for m in c.info["meta"]]
        for m in metas:
            c.kill9(m)
        c.kill9(kept)
        c.kill9(wiped)
        shutil.rmtree(os.path.join(c.dir, wiped, "data"))
        for m in metas:
            devcluster.start(c.dir, m, wait=False)
        devcluster.wait_ready(c.meta_urls)
        c.start(kept)   # ready once registered: the leader's registration is decided first, as in the chaos run
        assert (await _epochs(c))[kept] > before[kept]
        c.start(wiped)
        r = await wait_route(c, "r", lambda r: all(q["writable"] and len(q["in_sync"]) == 2 for q in r["queues"]),
                             timeout_s=60.0)
        for q in range(QUEUES):
            messages = await read_all(c, "r", q)
            at = {m["offset"]: m["body"] for m in messages}
            offsets = [m["offset"] for m in messages]
            assert offsets == list(range(len(offsets))), "offsets are not contiguous from 0"
            lost = [(off, body) for (queue, off), body in acked.items() if queue == q and at.get(off) != body]
            assert not lost, (q, lost[:5], len(lost))
        assert r["queues"][0]["broker"] == kept, r["queues"][0]
