"""A new head taking a group's pop state over from the brokers that held its queue before (broker/pop/service.py
``_state_for``, ``_ask_copies``, ``freeze``, the takeovers started by route changes and hints): whom it asks, at which
address, with which question, and what it starts from. One real broker node in this process (b1, the ``node``
fixture of tests/support/pop_node.py); the other brokers' answers come through its client to them
(``reader.peers``), as in tests/test_pop_service.py.
"""

from __future__ import annotations

import asyncio

import pytest
import structlog

from broker.peers import Unreachable
from broker.pop import service as service_mod
from broker.pop.state import QueueState
from tests.support import pop_copies as peers_mod
from tests.support import pop_node as base
from wire.errors import ApiError, rejection

node = base.node          # b1 heading queue 0 of topic t, its pop service started
KEY, seg, route, pop, until = base.KEY, base.seg, base.route, base.pop, base.until
Peers, take_over, with_addresses = peers_mod.Peers, peers_mod.take_over, peers_mod.with_addresses


async def refused_takeover(node) -> ApiError:
    with pytest.raises(ApiError) as e:
        await take_over(node)
    return e.value


# -- the copies of a gen whose leader holds nothing ------------------------------------------------------------------

async def test_copies_are_asked_at_their_own_addresses_and_a_takeover_they_do_not_answer_names_each_and_why(
        node, monkeypatch):
    """b2 led gen 0 and holds nothing now; b3 and b4, its in-sync copies, do not answer (one cannot be reached, one
    refuses): b1 pops nothing, and its answer names both and why, the first of them as the broker to wait for."""
    node.routes.update(with_addresses(route(6, [
        seg(0, "b2", 0, 7, "sealed", replicas=["b2", "b4", "b3"], in_sync=["b2", "b4", "b3"]),
        seg(1, "b1", 7, None, "active", 7)])))
    peers = Peers(node, monkeypatch, copies={("b3", 0): Unreachable("connection refused"),
                                             ("b4", 0): rejection(503, "CATCHING_UP", "behind")})
    with structlog.testing.capture_logs() as logs:
        e = await refused_takeover(node)
    assert (e.status, e.code, e.details) == (503, "BROKER_UNAVAILABLE", {
        "queue": 0, "broker": "b3", "reason": "b3: connection refused; b4: CATCHING_UP"})
    assert e.message == ("the pop state of queue 0 of 't' under gen 0 is held by none that answered, and "
                         "['b3', 'b4'] did not: starting without them could deliver acknowledged pops again")
    version = node.routes.version
    assert peers.asked == [
        ("own", "POST", "b2", "http://127.0.0.1:1", f"/v1/pop-handover/g/t/0?route_version={version}"),
        ("copy", "POST", "b4", "http://b4:1", f"/v1/pop-handover/g/t/0?route_version={version}&copy_of_gen=0"),
        ("copy", "POST", "b3", "http://b3:1", f"/v1/pop-handover/g/t/0?route_version={version}&copy_of_gen=0")]
    assert KEY not in node.pop.states
    # what an operator reads of it: whom it asked, what each answered or why it did not
    assert base.told(logs) == [
        {"event": "pop_handover_leader_answered", "key": KEY, "leader": "b2", "gen": 0, "found_gen": None,
         "next_offset": None},
        {"event": "pop_handover_copy_unanswered", "key": KEY, "copy": "b4", "why": "CATCHING_UP"},
        {"event": "pop_handover_copy_unanswered", "key": KEY, "copy": "b3", "why": "connection refused"}]


async def test_the_first_copy_holding_the_gen_asked_is_where_the_takeover_starts_and_no_other_is_asked(
        node, monkeypatch):
    node.routes.update(with_addresses(route(6, [
        seg(0, "b2", 0, 7, "sealed", replicas=["b2", "b3", "b4"], in_sync=["b2", "b3", "b4"]),
        seg(1, "b1", 7, None, "active", 7)])))
    peers = Peers(node, monkeypatch, copies={("b3", 0): {"found": True, "gen": 0, "next_offset": 6,
                                                         "deliveries": [[4, 2, 0]]},
                                             ("b4", 0): Unreachable("down")})
    with structlog.testing.capture_logs() as logs:
        st = await take_over(node)
    assert (st.gen, st.next_offset, sorted(st.in_flight), st.in_flight[4].attempt) == (1, 6, [4], 2)
    assert [a[2] for a in peers.asked] == ["b2", "b3"], "b4 not asked: b3 held the gen's state"
    assert base.told(logs)[1:] == [
        {"event": "pop_handover_copy_answered", "key": KEY, "copy": "b3", "gen": 0, "found_gen": 0,
         "next_offset": 6, "holds": None},
        {"event": "pop_state_taken_over", "key": KEY, "gen": 1, "start": 6, "adopted": 1, "from_gen": 0,
         "copy_gen": None, "asked": ["b1", "b2", "b3"]}]


async def test_a_copy_in_the_in_sync_set_whose_disk_held_the_gen_and_holds_no_state_of_it_settles_it(
        node, monkeypatch):
    """b1 holds its own gen-0 state; b2 led gen 1, lost before it popped; b3, in gen 1's in-sync set (not its
    sealer), held gen 1 on its disk and holds no state of it: b2 acknowledged nothing under gen 1, and b1 goes on
    from its own state although b2 does not answer."""
    node.routes.update(with_addresses(route(9, [
        seg(0, "b1", 0, 5, "sealed"),
        seg(1, "b2", 5, 5, "sealed", replicas=["b2", "b3"], in_sync=["b2", "b3"]),
        seg(2, "b1", 5, None, "active", 5)])))
    node.pop.states[KEY] = QueueState(KEY, 4, 0)
    Peers(node, monkeypatch, own={"b2": rejection(503, "BROKER_UNAVAILABLE", "b2 does not answer",
                                                  reason="down")},
          copies={("b3", 1): {"found": False, "holds": ["t.q0.g1"]}})
    with structlog.testing.capture_logs() as logs:
        st = await take_over(node)
    assert (st.gen, st.next_offset) == (2, 4)
    assert base.told(logs) == [
        {"event": "pop_handover_leader_unanswered", "key": KEY, "leader": "b2", "gen": 1, "why": "down"},
        {"event": "pop_handover_copy_answered", "key": KEY, "copy": "b3", "gen": 1, "found_gen": None,
         "next_offset": None, "holds": ["t.q0.g1"]},
        {"event": "pop_state_taken_over", "key": KEY, "gen": 2, "start": 4, "adopted": 0, "from_gen": 0,
         "copy_gen": None, "asked": ["b1", "b2", "b3"]}]


async def test_a_copy_that_held_another_segment_settles_nothing(node, monkeypatch):
    node.routes.update(with_addresses(route(9, [
        seg(0, "b1", 0, 5, "sealed"),
        seg(1, "b2", 5, 5, "sealed", replicas=["b2", "b3"], in_sync=["b2", "b3"]),
        seg(2, "b1", 5, None, "active", 5)])))
    node.pop.states[KEY] = QueueState(KEY, 4, 0)
    Peers(node, monkeypatch, own={"b2": rejection(503, "BROKER_UNAVAILABLE", "b2 does not answer")},
          copies={("b3", 1): {"found": False, "holds": ["t.q0.g0", "t.q1.g1"]}})
    assert (await refused_takeover(node)).code == "BROKER_UNAVAILABLE"
    assert node.pop.states[KEY].gen == 0


# -- which copy a takeover may use -----------------------------------------------------------------------------------

async def test_a_copy_held_here_of_an_older_gen_does_not_stand_in_for_a_later_gen_s_copies(node, monkeypatch):
    """b2 led gens 0 and 1 and holds nothing now; b1 holds a copy of gen 0's state only; b3, gen 1's other in-sync
    copy, holds gen 1's: that is where b1 starts, not from its older copy."""
    node.routes.update(with_addresses(route(9, [
        seg(0, "b2", 0, 5, "sealed", replicas=["b2", "b1"], in_sync=["b2", "b1"]),
        seg(1, "b2", 5, 5, "sealed", replicas=["b2", "b1", "b3"], in_sync=["b2", "b1", "b3"]),
        seg(2, "b1", 5, None, "active", 5)])))
    node.pop.replica.states[KEY] = QueueState(KEY, 4, 0)
    peers = Peers(node, monkeypatch, copies={("b3", 1): {"found": True, "gen": 1, "next_offset": 8}})
    st = await take_over(node)
    assert (st.gen, st.next_offset) == (2, 8), peers.asked


async def test_a_copy_held_here_out_of_the_gen_s_in_sync_set_is_not_used(node, monkeypatch):
    """b1 was fenced out of gen 0's in-sync set (and did not seal it): its copy may lack acks b2 answered. b2 holds
    nothing now; b3, in sync, holds gen 0's state: b1 starts from b3's."""
    node.routes.update(with_addresses(route(9, [
        seg(0, "b2", 0, 9, "sealed", replicas=["b2", "b3", "b1"], in_sync=["b2", "b3"]),
        seg(1, "b1", 9, None, "active", 9)])))
    node.pop.replica.states[KEY] = QueueState(KEY, 4, 0)
    Peers(node, monkeypatch, copies={("b3", 0): {"found": True, "gen": 0, "next_offset": 9}})
    st = await take_over(node)
    assert (st.gen, st.next_offset) == (1, 9)


# -- a copy becoming this broker's own on a freeze --------------------------------------------------------------------

async def test_a_copy_asked_for_by_its_gen_becomes_this_broker_s_own_frozen_state_on_disk_and_leaves_the_copies(
        node, monkeypatch):
    """b1 led gen 0 and still holds a delivery of it (offset 0, written); it holds a copy of gen 1's state (led by
    b3, which holds none now). Asked for gen 1's state, the copy becomes b1's own, frozen and on disk before the
    answer, its own older delivery gone from memory and from the journal (the copy's gen holds what became of it)."""
    from broker.pop import journal as journal_mod
    from broker.pop.state import Delivery
    await one_delivery_on_disk(node, monkeypatch, "b3")
    node.routes.update(route(6, [seg(0, "b1", 0, 1, "sealed"), seg(1, "b3", 1, 9, "sealed", 1),
                                 seg(2, "b3", 9, None, "active", 9)]))
    copy = node.pop.replica.states[KEY] = QueueState(KEY, 9, 1)
    copy.in_flight[5] = Delivery(77, 2, 0)
    answer = await node.pop.freeze(KEY, 6, caller="b3", copy_of_gen=1)
    assert (answer["gen"], answer["next_offset"], [o for o, *_ in answer["deliveries"]]) == (1, 9, [5])
    assert KEY not in node.pop.replica.states, "the copy is this broker's own now"
    st = node.pop.states[KEY]
    assert (st.gen, st.frozen, sorted(st.in_flight)) == (1, True, [5])
    written = journal_mod.load(node.pop.journal.path)[0][KEY]
    assert (written.gen, written.frozen, sorted(written.in_flight)) == (1, True, [5]), "on disk before the answer"


async def test_a_copy_asked_for_by_its_gen_where_this_broker_holds_no_state_of_its_own_answers(node):
    from broker.pop.state import Delivery
    node.routes.update(route(6, [seg(0, "b3", 0, 9, "sealed", replicas=["b3", "b1"], in_sync=["b3", "b1"]),
                                 seg(1, "b2", 9, None, "active", 9)]))
    copy = node.pop.replica.states[KEY] = QueueState(KEY, 9, 0)
    copy.in_flight[5] = Delivery(77, 2, 0)
    answer = await node.pop.freeze(KEY, 6, caller="b2", copy_of_gen=0)
    assert (answer["found"], answer["gen"], answer["next_offset"]) == (True, 0, 9)
    assert [o for o, *_ in answer["deliveries"]] == [5] and KEY not in node.pop.replica.states


async def test_a_freeze_is_on_disk_before_it_is_answered(node, monkeypatch):
    from broker.pop import journal as journal_mod
    await one_delivery_on_disk(node, monkeypatch, "b2")
    node.routes.update(route(6, [seg(0, "b1", 0, 1, "sealed"), seg(1, "b2", 1, None, "active", 1)]))
    await node.pop.freeze(KEY, 6, caller="b2")
    written = journal_mod.load(node.pop.journal.path)[0][KEY]
    assert (written.frozen, written.moved_below) == (True, 1)


# -- copies pushed here ------------------------------------------------------------------------------------------------

async def test_a_copy_takes_pushes_of_the_head_s_gen_or_of_a_queue_it_knows_no_head_of_and_refuses_older_ones(node):
    def line(gen: int, offsets: list[int], topic: str = "t") -> list:
        st = QueueState(("g", topic, 0), 10, gen)
        for o in offsets:
            st.adopt(o, 100 + o, 1, 0, 10**13)
        return st.take_line(10**13)
    node.routes.update(route(6, [seg(0, "b2", 0, 3, "sealed"), seg(1, "b2", 3, None, "active", 3,
                                                                    replicas=["b2", "b1"], in_sync=["b2", "b1"])]))
    await node.pop.receive_copy("t", 0, 1, False, [line(1, [1, 2])])
    assert sorted(node.pop.replica.states[KEY].in_flight) == [1, 2], "the head's own gen"
    await node.pop.receive_copy("t", 0, 1, True, [line(1, [2])])
    assert sorted(node.pop.replica.states[KEY].in_flight) == [2], "a snapshot replaces what was held"
    await node.pop.receive_copy("nope", 0, 0, True, [line(0, [4], "nope")])
    assert sorted(node.pop.replica.states[("g", "nope", 0)].in_flight) == [4], "no head known: taken"
    with pytest.raises(ApiError) as e:
        await node.pop.receive_copy("t", 0, 0, False, [line(0, [7])])
    assert (e.value.status, e.value.code, e.value.message, e.value.details) == (
        409, "NOT_LEADER", "t/0 has a head of gen 1 here, newer than the pushing leader's 0",
        {"topic": "t", "queue": 0, "gen": 1})
    assert sorted(node.pop.replica.states[KEY].in_flight) == [2]


# -- takeovers started by route changes and hints -----------------------------------------------------------------------

def gen_0_led_by_b2_then_b1(version: int = 9) -> dict:
    return route(version, [seg(0, "b2", 0, 3, "sealed", replicas=["b2", "b1"], in_sync=["b2", "b1"]),
                           seg(1, "b1", 3, None, "active", 3)])


async def one_delivery_on_disk(node, monkeypatch, peer: str) -> None:
    """Queue 0 holds one message, delivered once and written to the journal; every question to another broker is
    refused (``peer`` is not ready)."""
    async def refuse(method, segment, path, json=None):
        raise rejection(503, "CATCHING_UP", f"{peer} is not ready")
    monkeypatch.setattr(node.reader.peers, "request", refuse)
    await node.writer.send("t", 0, [{"body": "m"}])
    await pop(node, 1)
    await until(lambda: node.pop.states[KEY].in_flight[0].written and not node.pop.journal._changed)


def held_questions(node, monkeypatch) -> tuple[list[str], asyncio.Event]:
    """Every takeover's question to another broker recorded (its group) and held until the event is set; then each
    is answered "not found"."""
    asked: list[str] = []
    release = asyncio.Event()

    async def request(method, segment, path, json=None):
        asked.append(path.split("/")[3])
        await release.wait()
        return {"found": False}
    monkeypatch.setattr(node.reader.peers, "request", request)
    return asked, release


async def test_at_most_takeover_workers_keys_are_taken_over_at_once_each_once_and_every_one_in_the_end(
        node, monkeypatch):
    node.routes.update(gen_0_led_by_b2_then_b1())
    keys = [(f"g{i:02}", "t", 0) for i in range(service_mod.TAKEOVER_WORKERS + 3)]
    for key in keys:
        node.pop.replica.states[key] = QueueState(key, 3, 0)
    waiting, release = held_questions(node, monkeypatch)
    node.pop.take_over_copies_soon()
    await until(lambda: len(waiting) == service_mod.TAKEOVER_WORKERS)
    await asyncio.sleep(0.1)
    node.pop.take_over_copies_soon()
    await asyncio.sleep(0.1)
    assert len(waiting) == service_mod.TAKEOVER_WORKERS == node.pop._takeover_workers, "no more at once"
    release.set()
    await until(lambda: all(k in node.pop.states for k in keys))
    assert sorted(waiting) == sorted(k[0] for k in keys), "each asked once"
    assert not node.pop.replica.states and not node.pop._takeover_queued
    await until(lambda: node.pop._takeover_workers == 0)


async def test_a_key_queued_already_does_not_keep_the_next_one_from_being_queued(node, monkeypatch):
    node.routes.update(gen_0_led_by_b2_then_b1())
    g, h = ("g", "t", 0), ("h", "t", 0)
    node.pop.replica.states[g] = QueueState(g, 3, 0)
    asked, release = held_questions(node, monkeypatch)
    node.pop.take_over_copies_soon()
    await until(lambda: asked == ["g"])
    node.pop.replica.states[h] = QueueState(h, 3, 0)
    node.pop.take_over_copies_soon()
    await until(lambda: sorted(asked) == ["g", "h"])
    await asyncio.sleep(0.05)
    assert sorted(asked) == ["g", "h"], "g, being taken over, not queued again"
    release.set()
    await until(lambda: g in node.pop.states and h in node.pop.states)


async def test_a_copy_of_a_queue_that_moved_away_before_its_takeover_ran_is_kept(node, monkeypatch):
    node.routes.update(gen_0_led_by_b2_then_b1())
    peers = Peers(node, monkeypatch)
    node.pop.replica.states[KEY] = QueueState(KEY, 3, 0)
    node.pop.take_over_copies_soon()          # queued; its worker runs once this test yields
    node.routes.update(route(10, [seg(0, "b2", 0, 3, "sealed", replicas=["b2", "b1"], in_sync=["b2", "b1"]),
                                  seg(1, "b1", 3, 3, "sealed", 3), seg(2, "b3", 3, None, "active", 3)]))
    await until(lambda: not node.pop._takeover_queued)
    assert KEY in node.pop.replica.states and KEY not in node.pop.states and peers.asked == []


async def test_a_copy_an_older_head_s_own_answer_made_useless_is_dropped_once_taken_over(node, monkeypatch):
    node.routes.update(gen_0_led_by_b2_then_b1())
    node.pop.replica.states[KEY] = QueueState(KEY, 2, 0)
    Peers(node, monkeypatch, own={"b2": {"found": True, "gen": 0, "next_offset": 3}})
    node.pop.take_over_copies_soon()
    await until(lambda: KEY in node.pop.states)
    assert node.pop.states[KEY].next_offset == 3, "from b2's own answer"
    await until(lambda: KEY not in node.pop.replica.states)


async def test_a_hinted_takeover_forgets_the_hint_once_done_or_refused_for_the_bound(node, monkeypatch):
    node.routes.update(gen_0_led_by_b2_then_b1())
    Peers(node, monkeypatch)
    node.pop.take_over_soon(KEY)
    await until(lambda: KEY in node.pop.states and not node.pop._takeover_queued)
    assert not node.pop._hinted_here and not node.pop._takeover_retry_at
    monkeypatch.setattr(service_mod, "POP_QUEUES_MAX", 1)
    node.pop.take_over_soon(("h", "t", 0))    # one hint may wait; its state would be one too many
    await until(lambda: not node.pop._takeover_queued)
    assert not node.pop._hinted_here and not node.pop._takeover_retry_pending, "not tried again: refused the same way"


async def test_hints_past_the_bound_are_refused_by_name_but_a_key_hinted_already_is_taken(node, monkeypatch):
    monkeypatch.setattr(service_mod, "POP_QUEUES_MAX", 1)
    monkeypatch.setattr(service_mod, "TAKEOVER_RETRY_S", 60)
    node.routes.update(gen_0_led_by_b2_then_b1())
    Peers(node, monkeypatch, own={"b2": rejection(503, "CATCHING_UP", "behind")})
    node.pop.take_over_soon(KEY)
    await until(lambda: KEY in node.pop._takeover_retry_at)
    assert node.pop._hinted_here == {KEY} and node.pop._takeover_retry_pending, "kept, tried again later"
    node.pop.take_over_soon(KEY)
    with pytest.raises(ApiError) as e:
        node.pop.take_over_soon(("h", "t", 0))
    assert (e.value.status, e.value.code, e.value.message, e.value.details) == (
        409, "TOO_MANY_POP_QUEUES", "this broker keeps pop state of at most 1 (group, topic, queue)", {"limit": 1})
    node.routes.update(route(10, [seg(0, "b2", 0, 3, "sealed"), seg(1, "b2", 3, None, "active", 3)]))
    with pytest.raises(ApiError) as e:
        node.pop.take_over_soon(("h", "t", 0))
    assert (e.value.status, e.value.code, e.value.details) == (
        409, "NOT_LEADER", {"topic": "t", "queue": 0, "broker": "b2", "address": "http://127.0.0.1:1"})
    node.pop.take_over_copies_soon()
    assert not node.pop._hinted_here, "led elsewhere now: forgotten here"


async def test_a_holder_hints_only_heads_of_its_topic_with_an_address_and_a_newer_gen_than_it_holds(
        node, monkeypatch):
    told = []

    async def request(method, segment, path, json=None):
        told.append((method, segment.broker, segment.gen, path))
        return {"queued": True}
    monkeypatch.setattr(node.reader.peers, "request", request)
    other, g, h, c, d = ("g", "other", 0), ("g", "t", 0), ("h", "t", 0), ("c", "t", 0), ("d", "t", 0)
    node.pop.states[other] = QueueState(other, 1, 0)      # first in the table: another topic's is passed by
    node.pop.states[g] = QueueState(g, 4, 0)
    node.pop.states[h] = QueueState(h, 4, 0)
    node.pop.replica.states[c] = QueueState(c, 3, 1)       # a copy of gen 1's own state: its head holds it
    node.pop.replica.states[d] = QueueState(d, 3, 0)       # a copy of gen 0's

    def moved(version: int, address: str | None) -> None:
        head = dict(seg(1, "b2", 5, None, "active", 5), address=address)
        node.routes.update(route(version, [seg(0, "b1", 0, 5, "sealed"), head]))
        node.pop.hint_new_heads("t")
    moved(9, None)
    await asyncio_sleep(0.05)
    assert told == [], "no address to tell"
    moved(10, "http://127.0.0.1:1")
    await until(lambda: len(told) == 3)
    assert sorted(told) == [("POST", "b2", 1, f"/v1/pop-takeover/{k}/t/0") for k in "dgh"]
    for gone in (h, other):                                 # dropped here: h's mark is pruned, the others' kept
        del node.pop.states[gone]
    del node.pop.replica.states[c]
    moved(11, "http://127.0.0.1:1")
    await asyncio_sleep(0.05)
    assert len(told) == 3 and set(node.pop._hinted_heads) == {g, d}, node.pop._hinted_heads
    node.pop.states[h] = QueueState(h, 4, 0)               # held again: told again
    moved(12, "http://127.0.0.1:1")
    await until(lambda: len(told) == 4)
    assert told[3][3] == "/v1/pop-takeover/h/t/0"


async def asyncio_sleep(seconds: float) -> None:
    await asyncio.sleep(seconds)


async def test_a_hinted_key_that_moved_away_and_came_back_is_taken_over_at_once_not_after_its_old_pause(
        node, monkeypatch):
    monkeypatch.setattr(service_mod, "TAKEOVER_RETRY_S", 60)
    node.routes.update(gen_0_led_by_b2_then_b1())
    peers = Peers(node, monkeypatch, own={"b2": rejection(503, "CATCHING_UP", "behind")})
    node.pop.take_over_soon(KEY)
    await until(lambda: KEY in node.pop._takeover_retry_at)
    node.pop.take_over_copies_soon()           # a route change within the pause: not asked again
    await asyncio_sleep(0.1)
    assert len(peers.asked) == 1
    node.routes.update(route(10, [seg(0, "b2", 0, 3, "sealed", replicas=["b2", "b1"], in_sync=["b2", "b1"]),
                                  seg(1, "b1", 3, 3, "sealed", 3), seg(2, "b3", 3, None, "active", 3)]))
    node.pop.take_over_copies_soon()           # led elsewhere: the hint and its pause forgotten
    node.routes.update(route(11, [seg(0, "b2", 0, 3, "sealed", replicas=["b2", "b1"], in_sync=["b2", "b1"]),
                                  seg(1, "b1", 3, 3, "sealed", 3), seg(2, "b3", 3, 3, "sealed", 3),
                                  seg(3, "b1", 3, None, "active", 3)]))
    peers.own["b2"] = {"found": True, "gen": 0, "next_offset": 3}
    node.pop.take_over_soon(KEY)
    await until(lambda: KEY in node.pop.states, 5)
    assert node.pop.states[KEY].gen == 3


async def test_a_hinted_takeover_refused_again_after_its_retry_is_retried_again(node, monkeypatch):
    monkeypatch.setattr(service_mod, "TAKEOVER_RETRY_S", 0.1)
    node.routes.update(gen_0_led_by_b2_then_b1())
    refusals = [rejection(503, "CATCHING_UP", "behind")] * 3
    answered = []

    async def request(method, segment, path, json=None):
        answered.append(path)
        if refusals:
            raise refusals.pop()
        return {"found": True, "gen": 0, "next_offset": 3}
    monkeypatch.setattr(node.reader.peers, "request", request)
    node.pop.take_over_soon(KEY)
    await until(lambda: KEY in node.pop.states)
    assert len(answered) == 4 and not node.pop._takeover_retry_pending
