"""Exclusive consumer locks on the broker (issue 7): the lock table learnt from meta's watch stream, the fencing of
pulls and commits with it, and barriers after a topic grew.

The first part drives a real LockTable, Barriers and BrokerNode (not started) directly; the second runs real
processes (three meta nodes, two brokers) with short leases.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from broker import locks as locks_mod
from broker.config import BrokerConfig
from broker.locks import Barriers, LockEventError, LockTable, parse_event
from broker.node import BrokerNode
from client.wire.errors import ApiError
from client.wire.sse import SseEvent


def event(group="g", version=10, mode="exclusive", locks=None) -> dict:
    return {"group": group, "version": version, "mode": mode, "locks": {"t": [5, 6, None]} if locks is None else locks}


def table(ready: bool = True) -> LockTable:
    t = LockTable(lambda: ready)
    t.apply(event())
    return t


async def refused(coro) -> ApiError:
    with pytest.raises(ApiError) as e:
        await coro
    return e.value


# -- parsing -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("bad", [
    None, [], "x", {},
    event(group=""), event(group=7), {**event(), "group": None},
    event(version=-1), event(version=True), event(version="3"), {k: v for k, v in event().items() if k != "version"},
    event(mode="both"), event(mode=1),
    event(locks=[]), event(locks={"t": 5}), event(locks={"t": [1.5]}), event(locks={"t": [True]}),
    event(locks={"t": [-3]}), event(locks={"t": ["7"]}), event(locks={"": [1]}), {**event(), "locks": None},
])
def test_a_malformed_group_event_is_refused_and_changes_nothing(bad):
    t = table()
    before = dict(t.groups), t.max_token
    with pytest.raises(LockEventError):
        t.apply(bad)
    assert (dict(t.groups), t.max_token) == before


def test_a_group_event_parses_into_version_mode_and_tokens_per_queue():
    group, g = parse_event(event(mode=None, locks={"t": [None, 9], "u": []}))
    assert group == "g" and g.version == 10 and g.mode is None and g.locks == {"t": [None, 9], "u": []}


def test_only_a_newer_version_replaces_a_groups_table():
    t = table()
    assert not t.apply(event(version=10, locks={"t": [1, 1, 1]}))
    assert not t.apply(event(version=9, mode="shared", locks={"t": [1, 1, 1]}))
    assert t.current("g", "t", 0) == 5 and t.exclusive("g")
    assert t.apply(event(version=11, locks={"t": [7, 6, None]}))
    assert t.current("g", "t", 0) == 7 and t.current("g", "t", 2) is None and t.current("g", "t", 9) is None
    assert t.max_token == 7


# -- checking ------------------------------------------------------------------------------------------------------

async def test_the_current_token_passes_and_any_other_is_stale_for_an_exclusive_group():
    t = table()
    await t.check("g", "t", 0, 5)
    await t.check("g", "t", 1, 6)
    for queue, token in ((0, 6), (1, 5), (0, None), (2, 5), (2, None), (7, 5)):
        e = await refused(t.check("g", "t", queue, token))
        assert (e.status, e.code) == (409, "STALE_TOKEN"), (queue, token)
        assert e.details == {"group": "g", "topic": "t", "queue": queue}
    assert (await refused(t.check("g", "u", 0, 5))).code == "STALE_TOKEN", "a topic without locks has no owner"


async def test_shared_and_unknown_groups_pass_as_before():
    t = table()
    t.apply(event(group="s", mode="shared", locks={}))
    for group in ("s", "unknown"):
        await t.check(group, "t", 0, None)
        await t.check(group, "t", 0, 3)


async def test_nothing_naming_a_group_passes_before_the_broker_followed_the_log_since_registration():
    t = table(ready=False)
    for group, token in (("g", 5), ("g", None), ("other", None)):
        e = await refused(t.check(group, "t", 0, token))
        assert (e.status, e.code) == (503, "LOCKS_CATCHING_UP")


async def test_a_token_newer_than_the_table_waits_for_the_stream_and_passes_once_it_arrives():
    t = table()
    waiting = asyncio.create_task(t.check("g", "t", 0, 8))
    await asyncio.sleep(0.05)
    assert not waiting.done(), "a newer token waits instead of being refused as stale"
    t.apply(event(version=12, locks={"t": [8, 6, None]}))
    await asyncio.wait_for(waiting, 1.0)


async def test_a_newer_token_of_a_group_the_broker_does_not_know_yet_waits_too():
    """The broker may simply not have heard of the group yet; accepting any token then would let a stale one in."""
    t = table()
    waiting = asyncio.create_task(t.check("new", "t", 0, 20))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    t.apply(event(group="new", version=13, locks={"t": [21]}))   # the token was superseded meanwhile
    e = await refused(asyncio.wait_for(waiting, 1.0))
    assert e.code == "STALE_TOKEN"


async def test_a_token_the_stream_never_brings_is_refused_as_catching_up_after_a_bounded_wait(monkeypatch):
    monkeypatch.setattr(locks_mod, "LOCK_CATCH_UP_WAIT_S", 0.3)
    t = table()
    started = time.monotonic()
    e = await refused(t.check("g", "t", 0, 99))
    assert (e.status, e.code) == (503, "LOCKS_CATCHING_UP")
    assert 0.25 <= time.monotonic() - started < 2.0


async def test_waiters_beyond_the_limit_are_refused_at_once(monkeypatch):
    monkeypatch.setattr(locks_mod, "LOCK_WAITERS_MAX", 2)
    t = table()
    waiting = [asyncio.create_task(t.check("g", "t", 0, 50)) for _ in range(2)]
    await asyncio.sleep(0.05)
    started = time.monotonic()
    e = await refused(t.check("g", "t", 0, 50))
    assert e.code == "LOCKS_CATCHING_UP" and time.monotonic() - started < 0.5
    t.apply(event(version=20, locks={"t": [50]}))
    await asyncio.wait_for(asyncio.gather(*waiting), 1.0)


# -- the watch stream feeds the table ------------------------------------------------------------------------------

def node(tmp_path) -> BrokerNode:
    return BrokerNode(BrokerConfig(broker="b1", data_dir=str(tmp_path), http_host="127.0.0.1", http_port=1,
                                   meta_urls=("http://127.0.0.1:9",), token="bt", client_token="ct"))


def sse(kind: str, data) -> SseEvent:
    raw = data if isinstance(data, str) else json.dumps(data)
    return SseEvent(event=kind, data=raw, id=str(data.get("version")) if isinstance(data, dict) else None)


def test_group_events_of_the_watch_stream_fill_the_table_and_count_as_followed(tmp_path):
    n = node(tmp_path)
    try:
        n.link._on_event(sse("group", event(version=40)))
        assert n.locks.current("g", "t", 1) == 6
        assert n.routes.version == 40, "a group event's id is a resume point: the broker followed the log to it"
    finally:
        n.offsets.close()
        n.writer.stop()


def test_a_bad_group_event_is_logged_and_the_stream_goes_on(tmp_path):
    n = node(tmp_path)
    try:
        for bad in ("{not json", json.dumps(event(version="x")), json.dumps([1])):
            n.link._on_event(SseEvent(event="group", data=bad, id="41"))
        assert n.locks.groups == {} and n.routes.version == 0
        n.link._on_event(sse("group", event(version=42)))
        assert n.locks.exclusive("g")
    finally:
        n.offsets.close()
        n.writer.stop()


# -- barriers ------------------------------------------------------------------------------------------------------

class Positions:
    """Committed offsets and min offsets as a test sets them, counting how often the barrier asked."""

    def __init__(self):
        self.committed: dict[int, int] = {}
        self.mins: dict[int, int] = {}
        self.asks = 0

    async def committed_of(self, group: str, topic: str, queue: int) -> int:
        self.asks += 1
        return self.committed.get(queue, -1)

    async def min_of(self, topic: str, queue: int) -> int:
        return self.mins.get(queue, 0)


def grown(after_offset: int | None) -> dict:
    return {"topic": "t", "version": 3, "barriers": [{"queue": 2, "after_queue": 0, "after_offset": after_offset}]}


async def test_a_barrier_holds_until_the_group_committed_past_the_split_and_is_remembered_once_passed():
    p = Positions()
    b = Barriers(p.committed_of, p.min_of)
    assert await b.holding("g", grown(None), 2) == {"queue": 0, "after_offset": None}, "undecided is held"
    assert await b.holding("g", grown(10), 1) is None, "other queues have no barrier"
    p.committed[0] = 9
    assert await b.holding("g", grown(10), 2) == {"queue": 0, "after_offset": 10}
    p.committed[0] = 10
    assert await b.holding("g", grown(10), 2) is None
    asks = p.asks
    p.committed[0] = 3   # say a rewind: a passed barrier stays passed, and is not asked about again
    assert await b.holding("g", grown(10), 2) is None and p.asks == asks
    assert await b.holding("h", grown(10), 2) is not None, "another group has its own position"


async def test_a_group_that_never_committed_stands_at_the_old_queues_min_offset():
    p = Positions()
    b = Barriers(p.committed_of, p.min_of)
    p.mins[0] = 4
    assert await b.holding("g", grown(10), 2) is not None
    p.mins[0] = 12   # retention dropped everything before the split point
    assert await b.holding("g", grown(10), 2) is None


async def test_remembered_passes_are_bounded(monkeypatch):
    monkeypatch.setattr(locks_mod, "PASSED_BARRIERS_MAX", 3)
    p = Positions()
    p.committed[0] = 100
    b = Barriers(p.committed_of, p.min_of)
    for g in range(5):
        assert await b.holding(f"g{g}", grown(10), 2) is None
    assert len(b._passed) == 3
