"""Exclusive consumer locks on the broker (issue 7): the lock table learnt from meta's watch stream, the fencing of
pulls and commits with it, and barriers after a topic grew.

The first part drives a real LockTable, Barriers and BrokerNode (not started) directly; the second runs real
processes (three meta nodes, two brokers) with short leases.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

import pytest

from broker import locks as locks_mod
from broker.config import BrokerConfig
from broker.locks import Barriers, LockEventError, LockTable, parse_event
from broker.node import BrokerNode
from wire.errors import ApiError
from wire.sse import SseEvent


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
    t.apply({**event(group="s", mode="shared", locks={}), "tokens_through": 6})   # meta's counter, as it sends it
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


async def test_each_refusal_names_the_group_and_says_why(monkeypatch):
    """The messages are the API's: a client tells a missing token from a superseded one, and a broker that has not
    followed the log yet from a token it has not heard of."""
    monkeypatch.setattr(locks_mod, "LOCK_CATCH_UP_WAIT_S", 0.05)
    t = table()
    e = await refused(t.check("g", "t", 0, None))
    assert e.message == "an exclusive group's pulls and commits need the queue's lock token"
    e = await refused(t.check("g", "t", 0, 6))
    assert e.message == "this token is not the current lock of the queue for this exclusive group"
    e = await refused(t.check("g", "t", 0, 99))
    assert (e.code, e.details) == ("LOCKS_CATCHING_UP", {"group": "g"})
    assert e.message == ("this broker's lock table is behind the log (token 99 is newer than every token it has seen);"
                         " retry shortly")
    e = await refused(table(ready=False).check("g", "t", 0, 5))
    assert (e.code, e.details) == ("LOCKS_CATCHING_UP", {"group": "g"})
    assert e.message == ("this broker's lock table is behind the log (it has not followed the log up to its "
                         "registration yet); retry shortly")


async def test_before_any_group_event_every_token_is_newer_than_the_table(monkeypatch):
    """Token 1 is the cluster's first grant: a broker that has seen no event has not heard of it, and waits."""
    monkeypatch.setattr(locks_mod, "LOCK_CATCH_UP_WAIT_S", 0.05)
    t = LockTable(lambda: True)
    assert t.max_token == 0 and t.current("g", "t", 0) is None and not t.exclusive("g")
    assert (await refused(t.check("g", "t", 0, 1))).code == "LOCKS_CATCHING_UP"
    await t.check("g", "t", 0, None)   # no token, no group known: nothing to fence yet


async def test_a_waiter_that_left_frees_its_place(monkeypatch):
    monkeypatch.setattr(locks_mod, "LOCK_WAITERS_MAX", 1)
    monkeypatch.setattr(locks_mod, "LOCK_CATCH_UP_WAIT_S", 0.05)
    t = table()
    for _ in range(2):   # one at a time, each waits its whole bound: the one place is free again after each
        started = time.monotonic()
        assert (await refused(t.check("g", "t", 0, 50))).code == "LOCKS_CATCHING_UP"
        assert time.monotonic() - started >= 0.04
    monkeypatch.setattr(locks_mod, "LOCK_CATCH_UP_WAIT_S", 2.0)
    waiting = asyncio.create_task(t.check("g", "t", 0, 50))
    await asyncio.sleep(0.05)
    started = time.monotonic()
    assert (await refused(t.check("g", "t", 0, 50))).code == "LOCKS_CATCHING_UP", "the one place is taken"
    assert time.monotonic() - started < 0.5
    t.apply(event(version=20, locks={"t": [50]}))
    await asyncio.wait_for(waiting, 1.0)


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
        n.producer_log.close()
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
        n.producer_log.close()
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


async def test_remembered_passes_are_bounded_and_forget_the_oldest_first(monkeypatch):
    monkeypatch.setattr(locks_mod, "PASSED_BARRIERS_MAX", 3)
    p = Positions()
    p.committed[0] = 100
    b = Barriers(p.committed_of, p.min_of)
    for g in range(5):
        assert await b.holding(f"g{g}", grown(10), 2) is None
    assert len(b._passed) == 3
    asks = p.asks
    for g in (4, 3, 2):
        assert await b.holding(f"g{g}", grown(10), 2) is None
    assert p.asks == asks, "the newest passes are remembered"
    assert await b.holding("g0", grown(10), 2) is None
    assert p.asks == asks + 1, "the oldest one was forgotten and is asked again"


class KeyedPositions:
    """Committed offsets by (group, topic, queue) and min offsets by (topic, queue)."""

    def __init__(self, committed: dict | None = None, mins: dict | None = None):
        self.committed = committed or {}
        self.mins = mins or {}

    async def committed_of(self, group: str, topic: str, queue: int) -> int:
        return self.committed.get((group, topic, queue), -1)

    async def min_of(self, topic: str, queue: int) -> int:
        return self.mins.get((topic, queue), 0)


async def test_a_barrier_reads_the_position_of_its_own_group_and_topic():
    p = KeyedPositions(committed={("g", "t", 0): 10, ("h", "t", 0): 3, ("g", "u", 0): 3})
    assert await Barriers(p.committed_of, p.min_of).holding("g", grown(10), 2) is None
    assert await Barriers(p.committed_of, p.min_of).holding("h", grown(10), 2) is not None
    p = KeyedPositions(mins={("t", 0): 12, ("u", 0): 0})   # g never committed on t: it stands at t's min offset
    assert await Barriers(p.committed_of, p.min_of).holding("g", grown(10), 2) is None
    p = KeyedPositions(committed={("g", "t", 0): 0}, mins={("t", 0): 12})
    held = await Barriers(p.committed_of, p.min_of).holding("g", grown(10), 2)
    assert held == {"queue": 0, "after_offset": 10}, "a group that committed offset 0 stands at 0, not at the min"


async def test_every_barrier_of_the_queue_is_passed_in_turn():
    p = KeyedPositions(committed={("g", "t", 0): 10})
    b = Barriers(p.committed_of, p.min_of)
    assert await b.holding("g", {"topic": "t", "version": 1}, 2) is None, "a route without barriers holds nothing"
    route = {"topic": "t", "version": 5, "barriers": [
        {"queue": 1, "after_queue": 0, "after_offset": 3},
        {"queue": 2, "after_queue": 0, "after_offset": 10},
        {"queue": 2, "after_queue": 1, "after_offset": 5}]}
    for _ in range(2):   # the second time the first barrier of queue 2 is a remembered pass: the next one still holds
        assert await b.holding("g", route, 2) == {"queue": 1, "after_offset": 5}
    p.committed[("g", "t", 1)] = 5
    assert await b.holding("g", route, 2) is None


# -- real processes ------------------------------------------------------------------------------------------------

from ops import devcluster                                                        # noqa: E402
from tests.support.broker_http import admin, all_writable, send, wait_route       # noqa: E402
from tests.support.group_locks_http import a_owns_all, code, commit, head, pull, topic  # noqa: E402
from tests.support.group_locks_http import two_brokers                            # noqa: E402,F401  (a fixture)
from tests.support.group_members import HEARTBEAT_MS, beat, held, short_leases    # noqa: E402
from tests.support.meta_http import ok, wait_until                                # noqa: E402

STALE_OR_CATCHING_UP = {(409, "STALE_TOKEN"), (503, "LOCKS_CATCHING_UP")}


async def owner_moves_to_b(c, queues: int, topics=("t",)) -> dict[int, int]:
    """a leaves and b, already a member, takes every queue; returns b's tokens."""
    await ok(c, "POST", "/v1/groups/g/leave", "client", {"member": "a"})

    async def b_owns_all():
        got = held(await beat(c, "b", topics))
        return got if sorted(got) == list(range(queues)) else None
    return await wait_until(b_owns_all, 10, "b to own the queues a left")


async def test_only_the_current_owner_pulls_and_commits_and_describe_shows_its_offsets(two_brokers):
    c = two_brokers
    r = await topic(c, "t", 2, 5)
    await short_leases(c)
    a = held(await beat(c, "a"))
    assert sorted(a) == [0, 1]
    for q in (0, 1):
        s, b = await pull(c, r, q, a[q])   # the broker may hear of the grant a moment later: it waits for it
        assert s == 200 and [m["offset"] for m in b["messages"]] == list(range(5)), b
        assert code(*await commit(c, r, q, 3, a[q])) == (200, None)
    assert code(*await pull(c, r, 0)) == (409, "STALE_TOKEN"), "an exclusive group's pull needs its token"
    assert code(*await commit(c, r, 0, 4)) == (409, "STALE_TOKEN")
    assert code(*await pull(c, r, 0, a[1])) == (409, "STALE_TOKEN"), "another queue's token is no key to this one"
    assert code(*await pull(c, r, 0, group=None)) == (200, None), "a pull without a group is as before"
    s, b, _ = await c.call("GET", f"{head(r, 0)}/v1/offsets/g/t/0", "client")
    assert (s, b) == (200, {"offset": 3})

    await beat(c, "b")                      # b joins: half of a's queues are revoked, a leaves at once
    b_tokens = await owner_moves_to_b(c, 2)
    assert min(b_tokens.values()) > max(a.values())
    for q in (0, 1):
        assert code(*await pull(c, r, q, b_tokens[q])) == (200, None)
        assert code(*await pull(c, r, q, a[q])) == (409, "STALE_TOKEN"), "a's grant is gone"
        assert code(*await commit(c, r, q, 5, a[q])) == (409, "STALE_TOKEN")
        assert code(*await commit(c, r, q, 4, b_tokens[q])) == (200, None)

    seen = {}
    for url in c.broker_urls:               # each broker answers for the queues whose head it holds
        s, b, _ = await c.call("GET", f"{url}/v1/offsets/g/t", "client")
        assert s == 200, b
        seen.update({x["queue"]: (x["offset"], x["max_offset"]) for x in b["queues"]})
    assert seen == {0: (4, 5), 1: (4, 5)}
    described = await ok(c, "GET", "/v1/groups/g", "client")
    assert {(x["queue"], x["committed_offset"], x["lag"]) for x in described["assignments"]} == {(0, 4, 1), (1, 4, 1)}


async def test_a_shared_group_commits_and_pulls_without_tokens(two_brokers):
    c = two_brokers
    r = await topic(c, "t", 1, 2)
    await beat(c, "a", group="g", mode="shared")
    for _ in range(3):   # whether or not the broker heard of the group yet
        assert code(*await pull(c, r, 0)) == (200, None)
        assert code(*await commit(c, r, 0, 1)) == (200, None)


async def test_a_grown_topics_new_queue_is_held_until_the_group_committed_past_the_split(two_brokers):
    c = two_brokers
    await topic(c, "t", 1, 4, slots=16)
    await short_leases(c)
    s, b = await admin(c, "PATCH", 0, "/v1/topics/t", json={"queues": 2})
    assert s == 200, b
    r = await wait_route(c, "t", lambda r: len(r["queues"]) == 2 and all_writable(r)
                         and r["barriers"] and r["barriers"][0]["after_offset"] is not None)
    assert r["barriers"] == [{"queue": 1, "after_queue": 0, "after_offset": 4}]
    await send(c, "t", 1, ["moved-key"])
    tokens = await wait_until(lambda: a_owns_all(c, 2), 10, "a to own both queues")
    s, b = await pull(c, r, 1, tokens[1])
    assert s == 200 and b["messages"] == [] and b["next_offset"] == 0, b
    assert b["held_by"] == {"queue": 0, "after_offset": 4}, "never committed on queue 0: it stands at its start"
    assert code(*await commit(c, r, 0, 3, tokens[0])) == (200, None)
    s, b = await pull(c, r, 1, tokens[1])
    assert b["messages"] == [] and b["held_by"] == {"queue": 0, "after_offset": 4}, "one message of 0 is left"
    s, b = await pull(c, r, 1, group=None)
    assert [m["offset"] for m in b["messages"]] == [0] and "held_by" not in b, "only the exclusive group waits"
    assert code(*await commit(c, r, 0, 4, tokens[0])) == (200, None)
    s, b = await pull(c, r, 1, tokens[1])
    assert s == 200 and [m["offset"] for m in b["messages"]] == [0] and "held_by" not in b, b


async def test_a_restarted_broker_never_takes_the_old_token_after_a_new_grant(two_brokers):
    c = two_brokers
    r = await topic(c, "t", 1, 3, replicas=1)   # one copy: with more, the restart moves the queue (committed offsets follow in issue 37)
    await short_leases(c)
    old = held(await beat(c, "a"))[0]
    assert code(*await pull(c, r, 0, old)) == (200, None)
    name = next(b["broker"] for b in c.info["brokers"] if b["url"] == head(r, 0))
    c.kill9(name)
    await beat(c, "b")
    new = (await owner_moves_to_b(c, 1))[0]
    assert new > old
    devcluster.start(c.dir, name, wait=False)   # polled from its first answer on, before it has followed the log

    async def b_stays_alive():
        # b's lease is 2 s and a broker takes about that long to start: without heartbeats, meta expired b and
        # released its queue before the restarted broker could be asked, and the new token rightly read as stale.
        while True:
            await beat(c, "b")
            await asyncio.sleep(HEARTBEAT_MS / 1000)

    async def new_token_works():
        for token in (old, new):
            try:
                s, b = await pull(c, r, 0, token)
            except (OSError, asyncio.TimeoutError):
                return None   # not listening yet
            if token == old:
                assert code(s, b) in STALE_OR_CATCHING_UP, f"the superseded token was answered {s} {b}"
            elif s != 200:
                assert code(s, b) in STALE_OR_CATCHING_UP, (s, b)
                return None
        return True
    alive = asyncio.create_task(b_stays_alive())
    try:
        await wait_until(new_token_works, 20, "the restarted broker to take the new token", interval_s=0.02)
        assert code(*await commit(c, r, 0, 1, old)) == (409, "STALE_TOKEN")
        assert code(*await commit(c, r, 0, 1, new)) == (200, None)
    finally:
        alive.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await alive
    assert held(await beat(c, "b"))[0] == new, "b kept its queue, under the same token, throughout"


async def test_another_groups_newer_table_does_not_make_this_groups_new_grant_look_stale():
    """The stream sends each group's newest state, in version order: g2's table (tokens up to 30) can arrive while
    g's copy predates its grant of token 20. That grant must wait for g's table, not be refused as stale."""
    t = LockTable(lambda: True)
    t.apply({**event(version=10, locks={"t": [5, 6]}), "tokens_through": 6})
    t.apply({**event(group="g2", version=30, locks={"t": [30]}), "tokens_through": 30})
    waiting = asyncio.create_task(t.check("g", "t", 0, 20))
    await asyncio.sleep(0.05)
    assert not waiting.done(), "a grant newer than g's own horizon waits for g's table"
    t.apply({**event(version=31, locks={"t": [20, 6]}), "tokens_through": 30})
    await asyncio.wait_for(waiting, 1.0)
    e = await refused(t.check("g", "t", 0, 5))
    assert e.code == "STALE_TOKEN", "and the old owner's token is stale at once"


async def test_a_grant_newer_than_a_memberless_groups_table_waits_for_it_instead_of_passing_unfenced(monkeypatch):
    """CI saw this race: the broker held g's table from its config (no members, mode null) when a's first grant
    arrived with a pull; the pull passed as if g were not exclusive, past the barrier of a grown queue."""
    t = LockTable(lambda: True)
    t.apply({**event(mode=None, locks={}), "tokens_through": 4})
    waiting = asyncio.create_task(t.check("g", "t", 0, 5))
    await asyncio.sleep(0.05)
    assert not waiting.done(), "token 5 is past g's horizon: the broker's copy of g is behind"
    t.apply({**event(version=11, locks={"t": [5]}), "tokens_through": 5})
    await asyncio.wait_for(waiting, 1.0)
    assert t.exclusive("g")
    monkeypatch.setattr(locks_mod, "LOCK_CATCH_UP_WAIT_S", 0.3)
    for mode in ("shared", None):
        t = LockTable(lambda: True)
        t.apply({**event(mode=mode, locks={}), "tokens_through": 4})
        with pytest.raises(ApiError) as e:
            await t.check("g", "t", 0, 5)   # nothing arrives: it is refused as behind, not passed
        assert e.value.code == "LOCKS_CATCHING_UP", mode


def test_a_horizon_below_a_held_token_is_refused():
    with pytest.raises(LockEventError):
        parse_event({**event(locks={"t": [9]}), "tokens_through": 8})
