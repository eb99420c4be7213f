"""Pop's rounds over a topic's queues and its wake-ups (broker/pop/service.py ``pop``, ``_queues``, ``_pop_once``;
broker/pop/wakeup.py): each topic-wide pop starts one queue further round, a queue another pop holds is waited for
(its redeliveries first, then new messages, within the pop's max, an ordered one still blocked), a pop already full
waits for nobody and touches no other queue, a queue led elsewhere is no queue of this pop's, the refusals word for
word, the long poll's bound on waiters, and the per-topic stamps the long polls park on, at their bound. Also a few
takeover promises (an admin adoption at the pop offset, the copies a takeover from the queue's start names, a hint to
a new head sent once per gen). PopService on a real broker node in this process (tests/support/pop_node.py)."""

from __future__ import annotations

import asyncio
import json

import pytest
import structlog

from broker.pop import service as service_mod
from broker.pop import wakeup as wakeup_mod
from broker.pop.wakeup import TopicSignals
from tests.support import pop_copies as peers_mod
from tests.support import pop_node as base
from wire import route as route_model
from wire.errors import ApiError
from wire.sse import SseEvent

node = base.node          # b1 heading queue 0 of topic t, its pop service started
KEY, seg, route, pop, until, told = base.KEY, base.seg, base.route, base.pop, base.until, base.told
RELEASE_FALLBACK_S = 5.0  # a lock the test holds is let go by then whatever happens (a mutant that never frees it)


# -- the stamps the long polls park on ---------------------------------------------------------------------------------

def test_a_notification_gives_its_topic_a_new_stamp_and_no_other_topic_s():
    signals = TopicSignals()
    assert signals.stamp("t") == 0, "a topic never notified is at zero"
    seen = []
    for _ in range(3):
        signals.notify("t")
        seen.append(signals.stamp("t"))
    assert seen == [1, 2, 3]
    signals.notify("u")
    assert (signals.stamp("t"), signals.stamp("u")) == (3, 4), "one sequence for all: u's does not move t's"


async def test_past_their_bound_only_the_stamps_of_topics_nobody_waits_on_are_dropped(monkeypatch):
    """At TOPICS_TRACKED_MAX topics a known one still gets new stamps; a new one drops the stamps of the topics no
    pop is parked on (they read zero again) and keeps the one a pop waits on, so its notification is never lost."""
    monkeypatch.setattr(wakeup_mod, "TOPICS_TRACKED_MAX", 3)
    signals = TopicSignals()
    signals.notify("x")
    parked = asyncio.create_task(signals.wait("x", signals.stamp("x"), 10.0))
    await until(lambda: "x" in signals._events)     # the pop is parked on x
    signals.notify("a")
    signals.notify("b")                             # three topics: at the bound
    signals.notify("a")                             # a known topic at the bound is stamped on
    assert [signals.stamp(t) for t in "xab"] == [1, 4, 3]
    signals.notify("c")                             # a new one past the bound
    assert [signals.stamp(t) for t in "xabc"] == [1, 0, 0, 5]
    assert not parked.done()
    signals.notify("x")
    async with asyncio.timeout(base.WAIT_S):
        await parked
    assert signals.stamp("x") == 6


async def test_a_pop_whose_stamp_was_dropped_while_it_looked_is_woken_by_the_next_send(monkeypatch):
    """A pop reads t's stamp and looks; meanwhile other topics' notifications drop t's stamp (nobody was parked on
    it yet) and a send notifies t again. The pop then parks with its old stamp: it must return at once, not sleep
    its whole wait with the message there."""
    monkeypatch.setattr(wakeup_mod, "TOPICS_TRACKED_MAX", 2)
    signals = TopicSignals()
    signals.notify("t")
    stamp = signals.stamp("t")                      # the pop's look begins
    signals.notify("a")
    signals.notify("b")                             # past the bound: t's stamp is dropped
    assert signals.stamp("t") == 0
    signals.notify("t")                             # the send the pop's look missed
    async with asyncio.timeout(base.WAIT_S):
        await signals.wait("t", stamp, 60.0)        # returns at once
    assert "t" not in signals._events, "the pop never parked"


def _stream(node, kind: str, body: dict) -> None:
    """One event of meta's watch stream, handled as the broker's link handles it."""
    node.link._on_event(SseEvent(kind, json.dumps(body), str(body["version"])))


async def test_pops_on_a_topic_wake_when_a_route_makes_this_broker_a_head_and_a_deleted_topic_leaves_nothing(node):
    # The fixture's route (b1 heads queue 0) went into the table directly: through the stream, b1 learns it leads.
    _stream(node, "route", base.route(6, [seg(0, "b2", 0, None, "active")], queues=2))
    stamp = node.pop.signals.stamp("t")
    _stream(node, "route", base.route(7, [seg(0, "b1", 0, None, "active")], queues=2))
    assert node.pop.signals.stamp("t") > stamp, "queue 0 moved here: the topic's pops look again"
    stamp = node.pop.signals.stamp("t")
    _stream(node, "route", base.route(8, [seg(0, "b1", 0, None, "active")], queues=2))
    assert node.pop.signals.stamp("t") == stamp, "a route that moved nothing here (a config write) wakes nobody"
    _stream(node, "deleted", {"topic": "t", "version": 9})
    assert node.pop._led == {}, "what pop kept of a deleted topic's queues must go with it (one entry per topic)"


async def test_a_long_poll_past_the_bound_of_parked_pops_is_refused_at_once(node, monkeypatch):
    monkeypatch.setattr(service_mod, "POP_WAITERS_MAX", 2)
    parks = []
    real_wait = node.pop.signals.wait

    async def wait(topic, stamp, timeout_s):
        parks.append(topic)
        await real_wait(topic, stamp, timeout_s)

    monkeypatch.setattr(node.pop.signals, "wait", wait)
    polls = [asyncio.create_task(node.pop.pop("t", "g", 1, 60_000, 0, False, 20_000)) for _ in range(2)]
    try:
        await until(lambda: len(parks) == 2)
        with pytest.raises(ApiError) as e:
            await node.pop.pop("t", "g", 1, 60_000, 0, False, 2_000)
        assert (e.value.status, e.value.code, e.value.details) == (503, "TOO_MANY_WAITERS", {"limit": 2})
    finally:
        for p in polls:
            p.cancel()
        await asyncio.gather(*polls, return_exceptions=True)


# -- rounds over a topic's queues ----------------------------------------------------------------------------------

def three_queues(node) -> None:
    node.routes.update(route(6, [seg(0, "b1", 0, None, "active")], queues=3))


async def due_on(node, queue: int, body: str = "due") -> None:
    """One message of ``queue`` popped once with a 50 ms invisible time, and come due again."""
    await node.writer.send("t", queue, [{"body": body}])
    [m] = await pop(node, 1, invisible_ms=50, queue=queue)
    st = node.pop.states[("g", "t", queue)]
    await until(lambda: m.offset in st.ready)


async def test_each_topic_wide_pop_starts_one_queue_further_round(node):
    three_queues(node)
    for q in range(3):
        await node.writer.send("t", q, [{"body": f"q{q}m{i}"} for i in range(4)])
    firsts = []
    for _ in range(5):
        [m] = await pop(node, 1, queue=None)
        firsts.append(m.queue)
    assert all((b - a) % 3 == 1 for a, b in zip(firsts, firsts[1:])), firsts


async def test_a_pop_filled_by_its_first_queue_s_redelivery_touches_no_other_queue(node):
    """The first topic-wide pop starts at queue 1 (the rotation), whose redelivery fills it: queues 2 and 0 are not
    looked at, so no pop state of theirs comes to be (what an operator's stats list)."""
    three_queues(node)
    await due_on(node, 1)
    got = await pop(node, 1, queue=None)
    assert [(m.queue, m.offset, m.attempt) for m in got] == [(1, 0, 2)]
    assert [(s["queue"], s["in_flight"]) for s in node.pop.stats()] == [(1, 1)]


async def test_a_queue_led_elsewhere_is_not_one_of_a_topic_wide_pop_s_so_the_full_one_is_refused_word_for_word(
        node, monkeypatch):
    node.routes.update(route_model.route_json(
        topic="t", version=6, slots=16, order="best_tried", config={}, slot_table=[[0, 16, 0]], slot_table_version=6,
        barriers=[], queues=[route_model.queue_json(0, True, [seg(0, "b1", 0, None, "active")]),
                             route_model.queue_json(1, True, [dict(seg(0, "b2", 0, None, "active"),
                                                                   physical_queue="t.q1.g0")])]))
    monkeypatch.setattr(service_mod, "IN_FLIGHT_PER_QUEUE_MAX", 1)
    await node.writer.send("t", 0, [{"body": "m0"}, {"body": "m1"}])
    assert [(m.queue, m.offset) for m in await pop(node, 5, queue=None)] == [(0, 0)]
    for _ in range(2):   # whichever queue the rotation starts at
        with pytest.raises(ApiError) as e:
            await pop(node, 5, queue=None)
        assert (e.value.status, e.value.code, e.value.message, e.value.details) == (
            409, "TOO_MANY_IN_FLIGHT", "every queue popped holds as many invisible messages as it may: ack some first",
            {"in_flight_per_queue_max": 1, "in_flight_max": service_mod.IN_FLIGHT_MAX})


# -- a queue another pop holds -------------------------------------------------------------------------------------

class Holder:
    """The test holding one key's lock, as another pop would: ``take`` returns once held; let go at ``release`` (or
    after RELEASE_FALLBACK_S)."""

    def __init__(self, node, key):
        self.node, self.key = node, key
        self.held, self.go = asyncio.Event(), asyncio.Event()
        self.task: asyncio.Task | None = None

    async def _hold(self) -> None:
        async with self.node.pop.locks.hold(self.key):
            self.held.set()
            try:
                async with asyncio.timeout(RELEASE_FALLBACK_S):
                    await self.go.wait()
            except TimeoutError:
                pass

    async def take(self) -> None:
        self.task = asyncio.create_task(self._hold())
        await self.held.wait()

    def release(self) -> None:
        self.go.set()

    async def done(self) -> None:
        self.go.set()
        if self.task is not None:
            await self.task


def on_pull_of_queue_0(node, monkeypatch, then) -> None:
    """``then()`` once the pop reads queue 0's new messages (its first round's last step, queue 1 coming first)."""
    real = node.pop.reader.pull

    async def pull(topic, queue, offset, max_n, held_by=None):
        if queue == 0:
            then()
        return await real(topic, queue, offset, max_n, held_by)

    monkeypatch.setattr(node.pop.reader, "pull", pull)


def seen(popped) -> list[tuple[int, int, int]]:
    return sorted((m.queue, m.offset, m.attempt) for m in popped)


async def test_a_busy_queue_waited_for_gives_its_redeliveries_then_new_ones_after_what_the_free_ones_gave(
        node, monkeypatch):
    """Queue 1 (first in the round) is held by another pop; queue 0 gives its new message; then queue 1, let go,
    gives its due delivery, and one new message, the pop's max of 3 reached."""
    base.two_queues(node)
    await due_on(node, 1, "r1")
    await node.writer.send("t", 1, [{"body": "n1a"}, {"body": "n1b"}])
    await node.writer.send("t", 0, [{"body": "a0"}])
    holder = Holder(node, ("g", "t", 1))
    await holder.take()
    on_pull_of_queue_0(node, monkeypatch, holder.release)
    try:
        got = await pop(node, 3, queue=None)
    finally:
        await holder.done()
    assert seen(got) == [(0, 0, 1), (1, 0, 2), (1, 1, 1)]


async def test_a_pop_the_free_queues_filled_waits_for_no_busy_one(node):
    base.two_queues(node)
    await node.writer.send("t", 0, [{"body": "a0"}])
    await node.writer.send("t", 1, [{"body": "n1"}])
    holder = Holder(node, ("g", "t", 1))
    await holder.take()
    try:
        with structlog.testing.capture_logs() as logs:
            got = await pop(node, 1, queue=None)
    finally:
        await holder.done()
    assert seen(got) == [(0, 0, 1)]
    assert told(logs, "pop_busy_queue_skipped") == [], "not waited for, so not skipped"


async def test_an_ordered_pop_that_waited_for_a_busy_queue_finds_it_still_blocked(node, monkeypatch):
    """Queue 1's batch is out and invisible: an ordered pop takes nothing new of it, after waiting for it too."""
    base.two_queues(node)
    await node.writer.send("t", 1, [{"body": "o1"}])
    assert len(await pop(node, 1, queue=1, order=True)) == 1
    await node.writer.send("t", 1, [{"body": "o2"}])
    await node.writer.send("t", 0, [{"body": "a0"}])
    holder = Holder(node, ("g", "t", 1))
    await holder.take()
    waited = []
    real_take = node.pop._take_under_lock

    async def take_under_lock(key, phase, n, invisible_ms, order, queue):
        waited.append((key[2], phase, order))
        return await real_take(key, phase, n, invisible_ms, order, queue)

    monkeypatch.setattr(node.pop, "_take_under_lock", take_under_lock)
    on_pull_of_queue_0(node, monkeypatch, holder.release)
    try:
        got = await pop(node, 5, queue=None, order=True)
    finally:
        await holder.done()
    assert seen(got) == [(0, 0, 1)]
    assert waited[-2:] == [(1, "retry", True), (1, "new", True)], "queue 1 was waited for, in both phases"


async def test_a_queue_another_pop_takes_while_this_one_redelivers_is_waited_for(node, monkeypatch):
    """Queue 1 is free when this pop's redeliveries pass it and taken (by another pop) while queue 0's due delivery is
    read: its new message is still this pop's, once that pop lets it go."""
    base.two_queues(node)
    await due_on(node, 0, "a0")
    await node.writer.send("t", 0, [{"body": "b0"}])
    await node.writer.send("t", 1, [{"body": "n1"}])
    holder = Holder(node, ("g", "t", 1))
    real_read = node.pop.reader.read_history

    async def read_history(topic, queue, offset, max_n):
        if queue == 0 and holder.task is None:
            await holder.take()
        return await real_read(topic, queue, offset, max_n)

    monkeypatch.setattr(node.pop.reader, "read_history", read_history)
    on_pull_of_queue_0(node, monkeypatch, holder.release)
    try:
        got = await pop(node, 10, queue=None)
    finally:
        await holder.done()
    assert holder.task is not None, "queue 1 was taken during the pop"
    assert seen(got) == [(0, 0, 2), (0, 1, 1), (1, 0, 1)]


# -- takeovers -----------------------------------------------------------------------------------------------------

async def test_an_admin_adoption_at_or_past_the_pop_offset_takes_nothing(node):
    """Nothing at or past the pop offset was ever handed out: an offset there is a new message's, not a delivery to
    take over (adopted, the next pop would deliver it twice)."""
    await node.writer.send("t", 0, [{"body": "m0"}, {"body": "m1"}])
    [m0] = await pop(node, 1)
    assert node.pop.states[KEY].next_offset == 1
    assert await node.pop.adopt(KEY, [[1, 3], [2, 3], [0, 3]]) == 0
    assert [(m.offset, m.attempt) for m in await pop(node, 5)] == [(1, 1)]
    assert m0.offset == 0


async def test_a_takeover_that_starts_from_the_queue_s_start_names_the_copies_it_asked(node, monkeypatch):
    """b2 led gen 0 with b3 in sync; both answer that they hold no state of the group: b1 starts gen 1 from the
    queue's start, and tells which copies (broker, gen) it asked."""
    node.routes.update(peers_mod.with_addresses(route(9, [
        seg(0, "b2", 0, 3, "sealed", replicas=["b2", "b3"], in_sync=["b2", "b3"]),
        seg(1, "b1", 3, None, "active", 3)])))
    peers = peers_mod.Peers(node, monkeypatch)
    with structlog.testing.capture_logs() as logs:
        st = await peers_mod.take_over(node)
    assert (st.gen, st.next_offset) == (1, 0)
    assert [a[0] + ":" + a[2] for a in peers.asked] == ["own:b2", "copy:b3"]
    assert told(logs, "pop_state_from_queue_start") == [
        {"event": "pop_state_from_queue_start", "key": KEY, "gen": 1, "asked": ["b1", "b2", "b3"],
         "empty": ["b2", "b3"], "settled": [], "asked_copies": [("b3", 0)], "gens": [0, 1]}]


def pop_line(group: str, topic: str, gen: int) -> list:
    return [group, topic, 0, 0, gen, False, 0, [], []]


async def test_a_new_head_is_hinted_once_per_gen_though_the_copy_held_here_left_and_came_back(node, monkeypatch):
    """b2 leads gen 3 of t's queue 0; b1 holds a copy of gen 2's state of group g: b2 is told once. The copy is then
    dropped (a snapshot), another topic's copy arrives, and g's copy comes back under the same head: b2 was told of it
    already and is not told again (a new group's copy, g2's, is)."""
    node.routes.update(peers_mod.with_addresses(route(6, [seg(3, "b2", 0, None, "active")])))
    peers = peers_mod.Peers(node, monkeypatch)

    def hints() -> list[str]:
        return [a[4] for a in peers.asked if "/pop-takeover/" in a[4]]

    replica = node.pop.replica
    await replica.apply("t", 0, 2, False, [pop_line("g", "t", 2)])
    node.pop.hint_new_heads("t")
    await until(lambda: len(hints()) == 1)
    await replica.apply("t", 0, 2, True, [])                    # a snapshot of gen 2: g's copy dropped
    await replica.apply("u", 0, 2, False, [pop_line("g", "u", 2)])
    assert sorted(replica.states) == [("g", "u", 0)]
    node.pop.hint_new_heads("t")
    await replica.apply("t", 0, 2, False, [pop_line("g", "t", 2), pop_line("g2", "t", 2)])
    node.pop.hint_new_heads("t")
    await until(lambda: len(hints()) == 2)
    assert hints() == ["/v1/pop-takeover/g/t/0", "/v1/pop-takeover/g2/t/0"]
