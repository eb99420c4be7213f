"""Pop state on every copy (issue 37, broker/replication/pop_copies.py, broker/pop/replica.py), on real processes:
a pop group consuming while its queue's leader is killed with kill -9 and its data directory removed. No pop whose
ack was answered is delivered again, pops go on from the copy elected without waiting for the lost leader, every
message is delivered; a copy back on an empty disk gets the queue's whole pop state before it is in sync again."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import time

import aiohttp
import pytest

from broker.pop.replica import ReplicaPopStore
from tests.support.broker_http import admin, broker_has_route, route, wait_route
from tests.support.cluster import running
from wire.errors import ApiError

SESSION_TIMEOUT_MS = 3_000
EXTRA_META = {"session_timeout_ms": SESSION_TIMEOUT_MS, "heartbeat_interval_ms": 500}
GROUP = "pg"
MESSAGES = 600
INVISIBLE_MS = 3_000       # what a lost leader had handed out and nobody acked comes back this soon
CALL_TIMEOUT_S = 5.0
WAIT_S = SESSION_TIMEOUT_MS / 1000 + 30.0   # a failover and the redeliveries on a loaded 2-core machine


def lose(c, broker: str) -> None:
    c.kill9(broker)
    shutil.rmtree(os.path.join(c.dir, broker, "data"))


async def fill(c, topic: str, n: int) -> None:
    r = await route(c, topic)
    for i in range(0, n, 100):
        s, b, _ = await c.call("POST", f"{r['queues'][0]['address']}/v1/messages/{topic}/0", "client",
                               json={"messages": [{"body": f"m{j}"} for j in range(i, min(n, i + 100))]},
                               headers={"X-Route-Version": str(r["version"])})
        assert s == 200, b


async def one_queue(c, body: dict) -> dict:
    """Create topic ``body`` (one queue) and return its route once every copy is in sync and it takes writes."""
    s, b = await admin(c, "POST", 0, "/v1/topics", body)
    assert s == 201, b
    return await wait_route(c, "p", lambda r: len(r["queues"][0]["in_sync"]) == body["replicas"]
                            and r["queues"][0]["writable"])


async def led_by(c, broker: str) -> dict:
    """The route once ``broker`` leads the queue's head and it takes writes (a failover's end)."""
    return await wait_route(c, "p", lambda r: r["queues"][0]["broker"] == broker and r["queues"][0]["writable"],
                            timeout_s=WAIT_S)


async def paused_until_deposed(c, broker: str) -> None:
    """SIGSTOP ``broker`` (meta fences it once its session runs out: a refused connection would fence it at once)
    until another copy leads the queue and takes writes; then SIGCONT it."""
    os.kill(c.pid(broker), signal.SIGSTOP)
    try:
        await wait_route(c, "p", lambda r: r["queues"][0]["broker"] != broker and r["queues"][0]["writable"],
                         timeout_s=WAIT_S)
    finally:
        os.kill(c.pid(broker), signal.SIGCONT)


class PopLog:
    """What one pop consumer saw: each delivery (time, offset), and when each ack was answered ok."""

    def __init__(self) -> None:
        self.delivered: list[tuple[float, int]] = []
        self.acked: dict[int, float] = {}

    async def round(self, c, topic: str, ack: bool = True) -> int:
        """One pop at the queue's head as the route names it, its deliveries acked; how many it got (0 when
        refused or unanswered)."""
        q = (await route(c, topic))["queues"][0]
        try:
            s, b, _ = await c.call("POST", f"{q['address']}/v1/pop/{topic}", "client", timeout_s=CALL_TIMEOUT_S,
                                   json={"group": GROUP, "max": 20, "invisible_ms": INVISIBLE_MS})
        except (aiohttp.ClientError, asyncio.TimeoutError):
            return 0
        if s != 200:
            assert s in (409, 503), (s, b)
            return 0
        got = b["messages"]
        now = time.monotonic()
        self.delivered += [(now, m["offset"]) for m in got]
        if got and ack:
            try:
                s, a, _ = await c.call("POST", f"{q['address']}/v1/ack", "client", timeout_s=CALL_TIMEOUT_S,
                                       json={"group": GROUP, "handles": [m["handle"] for m in got]})
            except (aiohttp.ClientError, asyncio.TimeoutError):
                return len(got)
            if s == 200:
                done = time.monotonic()
                for m, r in zip(got, a["results"]):
                    if r["ok"]:
                        self.acked.setdefault(m["offset"], done)
        return len(got)

    def delivered_after_ack(self) -> list[int]:
        return sorted({o for t, o in self.delivered if o in self.acked and t > self.acked[o]})

    async def drain(self, c, topic: str, n: int) -> None:
        """Pop and ack until every offset below ``n`` was acked (unacked deliveries come back when due)."""
        deadline = time.monotonic() + WAIT_S
        while len(self.acked) < n:
            assert time.monotonic() < deadline, f"{n - len(self.acked)} messages never acked: " \
                                                f"{sorted(set(range(n)) - set(self.acked))[:20]}"
            if not await self.round(c, topic):
                await asyncio.sleep(0.1)


async def test_pops_acknowledged_before_their_leader_is_lost_with_its_disk_are_never_delivered_again(tmp_path):
    async with running(str(tmp_path), 3, 3, meta=EXTRA_META) as c:
        r = await one_queue(c, {"topic": "p", "queues": 1, "replicas": 3})
        victim = r["queues"][0]["broker"]
        await fill(c, "p", MESSAGES)
        log = PopLog()
        while len(log.acked) < MESSAGES // 3:
            assert await log.round(c, "p")
        await log.round(c, "p", ack=False)   # in flight when the leader is lost: delivered again once due
        lose(c, victim)
        killed_at = time.monotonic()
        while not await log.round(c, "p"):
            assert time.monotonic() - killed_at < WAIT_S, "no pop answered after the leader was lost"
            await asyncio.sleep(0.05)
        again = time.monotonic() - killed_at
        await log.drain(c, "p", MESSAGES)
        assert (await route(c, "p"))["queues"][0]["broker"] != victim
        assert log.delivered_after_ack() == [], "pops delivered again after their ack was answered"
        assert again <= SESSION_TIMEOUT_MS / 1000 + 2.0, f"pops went on {again:.2f} s after the leader was lost"


async def test_a_copy_back_on_an_empty_disk_gets_the_whole_pop_state_before_it_is_in_sync_again(tmp_path):
    """Two copies: the leader is lost, the other leads and acks pops alone; the lost one comes back on an empty disk
    and joins the in-sync set; then the other is lost too. Only the snapshot the leader sent before asking meta to
    add it brought it the acks made while it was away."""
    async with running(str(tmp_path), 3, 3, meta=EXTRA_META) as c:
        r = await one_queue(c, {"topic": "p", "queues": 1, "replicas": 2, "min_insync": 1})
        first, second = r["queues"][0]["replicas"]
        await fill(c, "p", 300)
        log = PopLog()
        while len(log.acked) < 100:
            assert await log.round(c, "p")
        lose(c, first)
        await led_by(c, second)
        deadline = time.monotonic() + WAIT_S
        while len(log.acked) < 200:
            assert time.monotonic() < deadline, len(log.acked)
            if not await log.round(c, "p"):
                await asyncio.sleep(0.05)
        # a leader the failover deposed cannot push to a copy that knows the new head
        stale = {"topic": "p", "queue": 0, "leader_gen": 0, "reset": True, "lines": []}
        s, b, _ = await c.call("PUT", f"{c.url(second)}/v1/replica/pop", "broker", json=stale)
        assert s == 409 and b["error"]["code"] == "NOT_LEADER", (s, b)
        c.start(first)
        await wait_route(c, "p", lambda r: set(r["queues"][0]["in_sync"]) == {first, second}, timeout_s=60.0)
        lose(c, second)
        await led_by(c, first)
        await log.drain(c, "p", 300)
        assert log.delivered_after_ack() == [], "pops delivered again after their ack was answered"


async def test_a_leader_elected_twice_over_passes_on_acks_made_before_the_first_failover(tmp_path):
    """Three copies; one is down while the first leader acks pops, then that leader is lost; the second leads and
    pops nothing; the one that was down comes back and joins the in-sync set with the second's snapshot; then the
    second is lost too. The snapshot must hold the state the second held as a copy (the chaos runner, seed 9:
    without the takeover at the failover, the third started the group over and delivered every acked pop again)."""
    async with running(str(tmp_path), 3, 3, meta=EXTRA_META) as c:
        r = await one_queue(c, {"topic": "p", "queues": 1, "replicas": 3, "min_insync": 1})
        first, second, third = r["queues"][0]["replicas"]
        c.kill9(third)   # its disk stays: it comes back out of sync, behind the acks below
        await wait_route(c, "p", lambda r: set(r["queues"][0]["in_sync"]) == {first, second}, timeout_s=WAIT_S)
        await fill(c, "p", 300)
        log = PopLog()
        while len(log.acked) < 100:
            assert await log.round(c, "p")
        lose(c, first)
        await led_by(c, second)
        c.start(third)
        await wait_route(c, "p", lambda r: set(r["queues"][0]["in_sync"]) == {second, third}, timeout_s=60.0)
        lose(c, second)
        await led_by(c, third)
        await log.drain(c, "p", 300)
        assert log.delivered_after_ack() == [], "pops delivered again after their ack was answered"


async def test_a_queue_remapped_off_a_leader_back_on_an_empty_disk_takes_the_pop_state_from_its_copy(tmp_path):
    """The leader is lost with its disk and the queue is remapped onto a broker that held no copy; the lost leader
    comes back empty. The new head asks it for the group's state, finds none, and must ask the copy it waited for
    (the chaos runner, seed 9: the new head started the group over from an older state)."""
    async with running(str(tmp_path), 3, 3, meta=EXTRA_META) as c:
        r = await one_queue(c, {"topic": "p", "queues": 1, "replicas": 2, "min_insync": 1})
        leader = r["queues"][0]["broker"]
        other = next(n for n in ("b1", "b2", "b3") if n not in r["queues"][0]["replicas"])
        await fill(c, "p", 300)
        log = PopLog()
        while len(log.acked) < 100:
            assert await log.round(c, "p")
        await log.round(c, "p", ack=False)   # in flight: the copy hands them over once due
        # Stopped, not killed, so meta does not fence it before the remap (a refused connection is noticed at
        # once): the remap leaves the old head to it to seal, and a failover never moves the state to the copy
        os.kill(c.pid(leader), signal.SIGSTOP)
        s, b = await admin(c, "POST", 0, "/v1/topics/p/remap", {"brokers": [other]})
        assert s == 200, b
        lose(c, leader)
        c.start(leader)
        await led_by(c, other)
        await log.drain(c, "p", 300)
        assert log.delivered_after_ack() == [], "pops delivered again after their ack was answered"


async def ten_popped_of_two_copies(c) -> tuple[str, str, list[str]]:
    """Topic p of one queue, two copies, min_insync 2, ten messages, all popped by GROUP (invisible for a minute):
    the head's address, its copy, and the ten handles."""
    r = await one_queue(c, {"topic": "p", "queues": 1, "replicas": 2, "min_insync": 2})
    address, copy = r["queues"][0]["address"], r["queues"][0]["replicas"][1]
    await fill(c, "p", 10)
    s, b, _ = await c.call("POST", f"{address}/v1/pop/p", "client", json={"group": GROUP, "max": 10,
                                                                           "invisible_ms": 60_000})
    assert s == 200 and len(b["messages"]) == 10, (s, b)
    return address, copy, [m["handle"] for m in b["messages"]]


async def test_an_ack_below_min_insync_is_refused_and_applied_nowhere_like_a_send(tmp_path):
    """With fewer copies in sync than min_insync a send is refused; so is an ack and a change of invisible time
    (the chaos runner: acks answered on a lone leader's disk came back after it lost it). Nothing is applied: the
    handle still works once the copy is back in sync."""
    async with running(str(tmp_path), 3, 3, meta=EXTRA_META) as c:
        address, copy, handles = await ten_popped_of_two_copies(c)
        c.kill9(copy)
        r = await wait_route(c, "p", lambda r: len(r["queues"][0]["in_sync"]) == 1, timeout_s=WAIT_S)
        await broker_has_route(c, address, r["version"])
        s, b, _ = await c.call("POST", f"{address}/v1/ack", "client", json={"group": GROUP, "handles": handles})
        assert s == 503 and b["error"]["code"] == "NOT_ENOUGH_REPLICAS", (s, b)
        s, b, _ = await c.call("POST", f"{address}/v1/invisible", "client",
                               json={"group": GROUP, "handle": handles[0], "invisible_ms": 60_000})
        assert s == 503 and b["error"]["code"] == "NOT_ENOUGH_REPLICAS", (s, b)
        c.start(copy)
        r = await wait_route(c, "p", lambda r: len(r["queues"][0]["in_sync"]) == 2, timeout_s=60.0)
        await broker_has_route(c, address, r["version"])
        s, b, _ = await c.call("POST", f"{address}/v1/ack", "client", json={"group": GROUP, "handles": handles})
        assert s == 200 and all(x["ok"] for x in b["results"]), (s, b)


async def test_an_ack_or_a_commit_whose_copy_leaves_the_set_below_min_insync_is_in_doubt_not_ok(tmp_path):
    """An ack and a commit made while the one copy is down wait for it until a fence takes it out of the in-sync set;
    the set is then below min_insync, so they are answered 503 REPLICATION_UNCONFIRMED (stored on the leader alone,
    in doubt), never ok (the chaos runner, seed 49: b1 answered acks ok once b3, dead, was fenced out, and they were
    delivered again after b1 lost its disk). Acked again once the copy is back in sync, they are ok."""
    async with running(str(tmp_path), 3, 3, meta=EXTRA_META) as c:
        address, copy, handles = await ten_popped_of_two_copies(c)
        c.kill9(copy)
        ack, commit = await asyncio.gather(
            c.call("POST", f"{address}/v1/ack", "client", json={"group": GROUP, "handles": handles},
                   timeout_s=WAIT_S),
            c.call("PUT", f"{address}/v1/offsets/og/p/0", "client", json={"offset": 5}, timeout_s=WAIT_S))
        for s, b, _ in (ack, commit):
            assert s == 503 and b["error"]["code"] == "REPLICATION_UNCONFIRMED", (s, b)
        assert len((await route(c, "p"))["queues"][0]["in_sync"]) == 1, "answered once the fence took the copy out"
        c.start(copy)
        r = await wait_route(c, "p", lambda r: len(r["queues"][0]["in_sync"]) == 2, timeout_s=60.0)
        await broker_has_route(c, address, r["version"])
        s, b, _ = await c.call("POST", f"{address}/v1/ack", "client", json={"group": GROUP, "handles": handles})
        assert s == 200 and all(x["ok"] for x in b["results"]), (s, b)
        s, b, _ = await c.call("PUT", f"{address}/v1/offsets/og/p/0", "client", json={"offset": 5})
        assert s == 200, (s, b)


async def test_a_leader_deposed_by_a_failover_refuses_acks_of_what_it_handed_out(tmp_path):
    """The copy a failover elected delivers again what the lost leader had in flight; the old leader, back, must
    not answer an ack of one ok (the chaos runner: acked there, delivered again by the new head)."""
    async with running(str(tmp_path), 3, 3, meta=EXTRA_META) as c:
        r = await one_queue(c, {"topic": "p", "queues": 1, "replicas": 2, "min_insync": 1})
        leader, address = r["queues"][0]["broker"], r["queues"][0]["address"]
        await fill(c, "p", 10)
        s, b, _ = await c.call("POST", f"{address}/v1/pop/p", "client", json={"group": GROUP, "max": 10,
                                                                               "invisible_ms": 60_000})
        assert s == 200 and len(b["messages"]) == 10, (s, b)
        handles = [m["handle"] for m in b["messages"]]
        await asyncio.sleep(0.6)   # old enough for the journal to write them, and so for the copy to hold them
        await paused_until_deposed(c, leader)
        deadline = time.monotonic() + WAIT_S
        while True:   # the old leader hears of the failover once its session is back
            s, b, _ = await c.call("POST", f"{c.url(leader)}/v1/ack", "client",
                                   json={"group": GROUP, "handles": handles[:1]}, timeout_s=CALL_TIMEOUT_S)
            if s == 200 and b["results"][0].get("code") == "HANDLE_EXPIRED":
                break
            assert s == 503 and time.monotonic() < deadline, ("an ack of a delivery the new head took over", s, b)
            await asyncio.sleep(0.1)


async def test_a_leader_deposed_then_elected_again_does_not_bring_back_what_was_acked_meanwhile(tmp_path):
    """A leader hands out pops and is deposed (paused past its session); the copy elected delivers them again once
    due and sees them acked; the old leader, back in sync, is elected again when that copy is lost. Its own older
    state still lists those deliveries in flight: taking the copy over must not bring them back (the chaos runner,
    seed 9)."""
    async with running(str(tmp_path), 3, 3, meta=EXTRA_META) as c:
        r = await one_queue(c, {"topic": "p", "queues": 1, "replicas": 2, "min_insync": 1})
        first, second = r["queues"][0]["replicas"]
        await fill(c, "p", 20)
        s, b, _ = await c.call("POST", f"{r['queues'][0]['address']}/v1/pop/p", "client",
                               json={"group": GROUP, "max": 20, "invisible_ms": INVISIBLE_MS})
        assert s == 200 and len(b["messages"]) == 20, (s, b)
        await asyncio.sleep(0.6)   # old enough for the journal to write them, and so for the copy to hold them
        await paused_until_deposed(c, first)
        await wait_route(c, "p", lambda r: set(r["queues"][0]["in_sync"]) == {first, second}, timeout_s=60.0)
        log = PopLog()
        await log.drain(c, "p", 20)   # delivered again by the second once due, and acked there
        lose(c, second)
        await led_by(c, first)
        deadline = time.monotonic() + INVISIBLE_MS / 1000 + 2.0   # past when the old deliveries would come due
        while time.monotonic() < deadline:
            await log.round(c, "p")
            await asyncio.sleep(0.1)
        assert log.delivered_after_ack() == [], "pops delivered again after their ack was answered"


async def test_handles_made_before_a_failover_are_refused_by_the_leader_elected_again(tmp_path):
    """A leader hands out pops and is deposed (paused past its session); the copy elected takes them over, is lost,
    and the first is elected again from its copy. Its old handles name deliveries a head between took over: an ack
    of one must be refused, or an ack could be answered ok for a delivery another consumer now holds (the chaos
    runner's fixed seed: stale_pop_acks)."""
    async with running(str(tmp_path), 3, 3, meta=EXTRA_META) as c:
        r = await one_queue(c, {"topic": "p", "queues": 1, "replicas": 2, "min_insync": 1})
        first, second = r["queues"][0]["replicas"]
        await fill(c, "p", 10)
        s, b, _ = await c.call("POST", f"{r['queues'][0]['address']}/v1/pop/p", "client",
                               json={"group": GROUP, "max": 10, "invisible_ms": 60_000})
        assert s == 200 and len(b["messages"]) == 10, (s, b)
        handles = [m["handle"] for m in b["messages"]]
        await asyncio.sleep(0.6)   # old enough for the journal to write them, and so for the copy to hold them
        await paused_until_deposed(c, first)
        await wait_route(c, "p", lambda r: set(r["queues"][0]["in_sync"]) == {first, second}, timeout_s=60.0)
        lose(c, second)
        await led_by(c, first)
        deadline = time.monotonic() + WAIT_S
        while True:   # the first takes the state over with its first pop or ack after the route names it
            s, b, _ = await c.call("POST", f"{c.url(first)}/v1/ack", "client",
                                   json={"group": GROUP, "handles": handles}, timeout_s=CALL_TIMEOUT_S)
            if s == 200:
                break
            assert s == 503 and time.monotonic() < deadline, (s, b)
            await asyncio.sleep(0.1)
        assert [x.get("code") for x in b["results"]] == ["HANDLE_EXPIRED"] * 10, b


async def test_a_snapshot_replaces_what_the_copy_held_of_the_queue_here_and_after_a_reopen(tmp_path):
    """broker/pop/replica.py alone: a delta line only adds and removes, so without the reset a delivery acked
    since (absent from the snapshot) would outlive it."""
    path = str(tmp_path / "replica.log")
    store = ReplicaPopStore(path)
    key = ("g", "t", 0)
    await store.apply("t", 0, 1, False, [["g", "t", 0, 10, 1, False, 0, [[4, 7, 1, 99, 0], [5, 8, 1, 99, 0]], []]])
    await store.apply("t", 0, 1, False, [["h", "t", 0, 3, 1, False, 0, [], []]])
    await store.apply("t", 0, 1, True, [["g", "t", 0, 12, 1, False, 0, [[5, 8, 1, 99, 0]], []]])   # 4 acked meanwhile
    assert sorted(store.states) == [key] and sorted(store.states[key].in_flight) == [5]
    await store.apply("t", 1, 1, False, [["g", "t", 1, 2, 1, False, 0, [], []]])   # another queue: no reset of it
    store.close()
    again = ReplicaPopStore(path)
    assert sorted(again.states) == [key, ("g", "t", 1)]
    assert sorted(again.states[key].in_flight) == [5] and again.states[key].next_offset == 12
    with pytest.raises(ApiError) as refused:
        await again.apply("t", 0, 1, False, [["g", "other", 0, 1, 1, False, 0, [], []]])
    assert refused.value.status == 400 and sorted(again.states[key].in_flight) == [5], "nothing applied"
    again.close()
