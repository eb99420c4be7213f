"""A takeover of a group's pop state from a copy (broker/pop/service.py ``_from_copy``, ``_ask_copies``): what the new
head starts from when the copy it takes is its own (the deliveries in flight there, each with its deadline, the dead
ones going to the dead-letter queue once), and which state it starts from when several copies answer with older
states of their own. One real broker node in this process (b1, the ``node`` fixture of tests/support/pop_node.py); the
other brokers answer through its client to them (tests/support/pop_copies.py, as in tests/test_pop_takeover.py).
"""

from __future__ import annotations

from broker.codec import messages
from broker.pop import service as service_mod
from broker.pop.state import Delivery, QueueState
from tests.support import pop_copies as peers_mod
from tests.support import pop_node as base
from wire.errors import rejection

node = base.node          # b1 heading queue 0 of topic t, its pop service started
KEY, seg, route, pop, until = base.KEY, base.seg, base.route, base.pop, base.until


async def b2_lost_with_b1_s_copy_of_gen_0(node, monkeypatch, *deliveries: tuple[int, Delivery]) -> QueueState:
    """Queue 0 holds m0..m2; b2 led gen 0 over them with b1 in sync and is lost (it does not answer); b1 leads gen 1
    and holds a copy of b2's gen-0 state, popped up to offset 3, with ``deliveries`` in flight. Returns the copy."""
    await node.writer.send("t", 0, [{"body": f"m{i}"} for i in range(3)])
    node.routes.update(route(9, [seg(0, "b2", 0, 3, "sealed", replicas=["b2", "b1"], in_sync=["b2", "b1"]),
                                 seg(1, "b1", 3, None, "active", 3)]))
    copy = node.pop.replica.states[KEY] = QueueState(KEY, 3, 0)
    for offset, d in deliveries:
        copy.in_flight[offset] = d
    peers_mod.Peers(node, monkeypatch, own={"b2": rejection(503, "BROKER_UNAVAILABLE", "b2 does not answer",
                                                            reason="down")})
    return copy


async def dlq(node) -> list[tuple[int, int, str]]:
    return [(m["origin_offset"], m["attempts"], m["body"]) for m in (await node.pop.dlq.read("g", 0, 10))["messages"]]


# -- the deliveries in flight of a copy taken over --------------------------------------------------------------------

async def test_each_delivery_taken_from_a_copy_comes_due_here_at_the_deadline_the_lost_leader_gave_it(
        node, monkeypatch):
    """m0's invisible time ends in 100 ms, m1's in a minute: m0 goes out again once due, m1 stays invisible (its
    consumer may still be working on it)."""
    now = service_mod.now_ms()
    await b2_lost_with_b1_s_copy_of_gen_0(node, monkeypatch, (0, Delivery(6, 1, now + 100)),
                                          (1, Delivery(7, 2, now + 60_000)))
    st = await peers_mod.take_over(node)
    assert (st.gen, st.next_offset, sorted(st.in_flight)) == (1, 3, [0, 1])
    await until(lambda: 0 in st.ready)
    assert [(m.offset, m.attempt) for m in await pop(node, 5)] == [(0, 2)]
    assert 1 not in st.ready and st.in_flight[1].deadline_ms == now + 60_000


async def test_a_delivery_the_lost_leader_marked_dead_goes_to_the_dlq_though_the_group_allows_more_attempts_now(
        node, monkeypatch):
    """b2 marked m2 dead after its second attempt; the group's max_attempts has been raised to 5 since. Taken over,
    m2 is dead-lettered here as b2 decided, never delivered a third time."""
    base.max_attempts(node, "g", 5)
    await b2_lost_with_b1_s_copy_of_gen_0(node, monkeypatch, (2, Delivery(8, 2, 0, dead=True)))
    st = await peers_mod.take_over(node)
    await until(lambda: node.pop.dead_lettered == 1 or 2 in st.ready)
    assert 2 not in st.ready, "delivered again after it was dead"
    await until(lambda: 2 not in st.in_flight)
    assert await dlq(node) == [(2, 2, "m2")]
    assert await pop(node, 5) == []


async def test_a_dead_delivery_of_a_copy_this_broker_s_dlq_holds_already_is_not_copied_to_it_again(
        node, monkeypatch):
    """b1 dead-lettered m2 itself once (its DLQ holds it) and the removal never reached the copies; the copy b1 takes
    over still holds m2 as dead: it is removed from the state with no second copy in the DLQ."""
    await b2_lost_with_b1_s_copy_of_gen_0(node, monkeypatch, (2, Delivery(8, 5, 0, dead=True)))
    m2 = messages((await node.reader.read_history("t", 0, 2, 1))["messages"])[0].payload
    await node.pop.dlq.append("g", [{"topic": "t", "queue": 0, "origin_offset": 2, "attempts": 5, "message": m2}], 0)
    st = await peers_mod.take_over(node)
    await until(lambda: 2 not in st.in_flight)
    assert await dlq(node) == [(2, 5, "m2")], "once"
    assert node.pop.dead_lettered == 0


# -- which older state a takeover starts from ---------------------------------------------------------------------------

async def test_of_two_copies_answering_states_of_the_same_older_gen_the_in_sync_one_asked_first_is_started_from(
        node, monkeypatch):
    """b3 led gen 0 (popped to 6, offset 5 in flight); b2 grew gen 1 out of it without popping and holds nothing now.
    Asked for gen 1's state, b3 (in gen 1's in-sync set) answers its own gen-0 state, and b4 (a replica out of sync)
    an older one of gen 0 it made its own (popped to 4): b1 starts from b3's, with b3's delivery in flight."""
    node.routes.update(peers_mod.with_addresses(route(9, [
        seg(0, "b3", 0, 8, "sealed"),
        seg(1, "b2", 8, 8, "sealed", 8, replicas=["b2", "b3", "b4"], in_sync=["b2", "b3"]),
        seg(2, "b1", 8, None, "active", 8)])))
    peers = peers_mod.Peers(node, monkeypatch, copies={
        ("b3", 1): {"found": True, "gen": 0, "next_offset": 6, "deliveries": [[5, 2, 0]]},
        ("b4", 1): {"found": True, "gen": 0, "next_offset": 4, "deliveries": []}})
    st = await peers_mod.take_over(node)
    assert [(a[0], a[2]) for a in peers.asked] == [("own", "b2"), ("copy", "b3"), ("copy", "b4")]
    assert (st.gen, st.next_offset, {o: d.attempt for o, d in st.in_flight.items()}) == (2, 6, {5: 2})
