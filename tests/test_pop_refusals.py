"""Every refusal of pop's service, as a client or another broker reads it: status, code, message and details, exactly
(tests/test_pop_service.py checks mostly the codes), and the hand-over chores around a freeze. A real broker node in
this process (the ``node`` fixture of tests/support/pop_node.py), so a mutant of broker/pop is what runs.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from broker.pop import journal as journal_mod
from broker.pop import service as service_mod
from broker.pop.state import QueueState
from tests.support import pop_node as base
from wire.errors import ApiError

node = base.node          # b1 heading queue 0 of topic t, its pop service started
KEY, seg, route, pop, until = base.KEY, base.seg, base.route, base.pop, base.until
ADDRESS = "http://127.0.0.1:1"
NOT_HELD = "this broker does not hold the queue's writable segment"


def refusal(e: ApiError) -> tuple:
    return e.status, e.code, e.message, e.details


async def refused(awaitable) -> tuple:
    with pytest.raises(ApiError) as e:
        await awaitable
    return refusal(e.value)


def moved_to_b2(version: int = 6, address: str | None = ADDRESS) -> dict:
    """Queue 0 of t remapped from b1 (gen 0, offsets 0-2) to b2 (gen 1)."""
    head = dict(seg(1, "b2", 3, None, "active", 3), address=address)
    return route(version, [seg(0, "b1", 0, 3, "sealed"), head])


# -- a pop, an ack, a change of invisible time -----------------------------------------------------------------------

async def test_a_pop_of_a_topic_or_queue_not_here_is_refused_with_their_names(node):
    assert await refused(node.pop.pop("nope", "g", 1, 60_000, None, False, 0)) == (
        404, "TOPIC_NOT_FOUND", "topic 'nope' is unknown to this broker", {"topic": "nope"})
    assert await refused(pop(node, queue=1)) == (404, "QUEUE_NOT_FOUND", "queue 1 does not exist",
                                                 {"topic": "t", "queue": 1})
    node.routes.update(moved_to_b2())
    assert await refused(pop(node)) == (409, "NOT_LEADER", NOT_HELD,
                                        {"topic": "t", "queue": 0, "broker": "b2", "address": ADDRESS})
    node.routes.update(route(7, [seg(0, "b1", 0, 3, "sealed"), seg(1, "b1", None, None, "active", 3)]))
    assert await refused(pop(node)) == (503, "SEALING", "the queue is being remapped; retry shortly",
                                        {"topic": "t", "queue": 0})


async def test_a_broker_catching_up_says_what_it_does_again_once_current(node):
    await node.writer.send("t", 0, [{"body": "m"}])
    [m] = await pop(node, 1)
    node.session.state = "lapsed"
    behind = "this broker's meta session has lapsed or its routes are behind the log; it {} again once both are current"
    assert await refused(pop(node)) == (503, "CATCHING_UP", behind.format("pops"), {})
    assert await refused(node.pop.ack("g", [m.handle])) == (503, "CATCHING_UP", behind.format("acks"), {})
    assert await refused(node.pop.change_invisible("g", m.handle, 1000)) == (
        503, "CATCHING_UP", behind.format("changes invisible times"), {})
    with pytest.raises(ApiError) as e:
        node.pop.take_over_soon(KEY)
    assert refusal(e.value) == (503, "CATCHING_UP", behind.format("takes the pop state over"), {})


async def test_a_new_invisible_time_for_a_handle_not_in_flight_says_why(node):
    await node.writer.send("t", 0, [{"body": "m"}])
    [m] = await pop(node, 1)
    assert await refused(node.pop.change_invisible("g", "garbage", 60_000)) == (
        400, "INVALID_HANDLE", "the handle is malformed or unknown to this broker: not made by this broker for this "
        "group, or never delivered", {})
    assert (await node.pop.ack("g", [m.handle]))[0]["ok"]
    assert await refused(node.pop.change_invisible("g", m.handle, 60_000)) == (
        409, "HANDLE_EXPIRED", "the handle no longer names a delivery in flight: it was acked, delivered again, "
        "given a new handle or dead-lettered", {})


async def test_an_ack_answers_each_handle_with_its_own_code_and_the_handle_only_if_it_is_text(node):
    await node.writer.send("t", 0, [{"body": "m"}])
    [m] = await pop(node, 1)
    assert await node.pop.ack("g", [m.handle, 7, "garbage", m.handle]) == [
        {"handle": m.handle, "ok": True}, {"handle": None, "ok": False, "code": "INVALID_HANDLE"},
        {"handle": "garbage", "ok": False, "code": "INVALID_HANDLE"}, {"handle": m.handle, "ok": True}]


async def test_long_polls_past_the_bound_are_refused_and_a_finished_one_frees_its_place(node, monkeypatch):
    monkeypatch.setattr(service_mod, "POP_WAITERS_MAX", 1)
    parked = asyncio.create_task(node.pop.pop("t", "g", 1, 60_000, 0, False, 5_000))
    await until(lambda: node.pop._waiters == 1)
    assert await refused(node.pop.pop("t", "g", 1, 60_000, 0, False, 1_000)) == (
        503, "TOO_MANY_WAITERS", "too many pops are long-polling on this broker; retry shortly or with a shorter "
        "wait_ms", {"limit": 1})
    assert await node.pop.pop("t", "g", 1, 60_000, 0, False, 0) == [], "a pop that does not wait is answered"
    await node.writer.send("t", 0, [{"body": "m"}])
    node.pop.signals.notify("t")
    assert [m.offset for m in await asyncio.wait_for(parked, 5)] == [0]
    assert node.pop._waiters == 0
    started = time.monotonic()
    assert await node.pop.pop("t", "g", 1, 60_000, 0, False, 100) == [], "its place is free again"
    assert time.monotonic() - started >= 0.09


# -- the state between heads: freeze and adopt ---------------------------------------------------------------------

async def test_a_freeze_is_refused_by_name_to_a_broker_that_is_not_the_head_and_while_this_one_is(node, monkeypatch):
    assert await refused(node.pop.freeze(KEY, 5)) == (
        409, "NOT_LEADER", "this broker holds the queue's head: its pop state is current here", {})
    assert await refused(node.pop.freeze(KEY, 5, caller="b2")) == (
        403, "PERMISSION_DENIED", "broker 'b2' may not take over the pop state of queue 0 of 't': it is not the "
        "queue's head", {"caller": "b2", "allowed": ["b1"]})
    assert await refused(node.pop.freeze(("g", "nope", 3), 5, caller="b2")) == (
        403, "PERMISSION_DENIED", "broker 'b2' may not take over the pop state of queue 3 of 'nope': it is not the "
        "queue's head", {"caller": "b2", "allowed": []}), "no head known: no broker may"
    monkeypatch.setattr(service_mod, "HANDOVER_WAIT_S", 0.1)
    assert await refused(node.pop.freeze(KEY, 6, caller="b2")) == (
        503, "CATCHING_UP", "this broker has not seen the route that moved the queue yet", {})


async def test_a_freeze_waits_for_the_route_that_moved_the_queue_and_answers_soon_after_it(node):
    node.pop.states[KEY] = QueueState(KEY, 2, 0)
    asked = asyncio.create_task(node.pop.freeze(KEY, 6, caller="b2"))
    await asyncio.sleep(0.2)
    assert not asked.done(), "waits for the route"
    node.routes.update(moved_to_b2())
    moved = time.monotonic()
    answer = await asyncio.wait_for(asked, 5)
    assert time.monotonic() - moved < 0.8, "looked again within a tick"
    assert (answer["found"], answer["gen"], answer["next_offset"]) == (True, 0, 2)


async def test_a_freeze_busy_behind_the_key_s_lock_names_the_queue(node, monkeypatch):
    monkeypatch.setattr(service_mod, "HANDOVER_LOCK_WAIT_S", 0.1)
    node.routes.update(moved_to_b2())
    async with node.pop.locks.hold(KEY):
        assert await refused(node.pop.freeze(KEY, 6, caller="b2")) == (
            503, "CATCHING_UP", "this broker's pop state of the queue is busy (a pop or a journal round); ask again "
            "shortly", {"queue": 0})


async def test_a_freeze_of_a_state_with_nothing_in_flight_leaves_no_hand_over_running(node, monkeypatch):
    """Frozen with nothing to hand over, the chore that hands deliveries over ends at once; one that found the head
    back here ends too, asking nobody."""
    asked = []

    async def request(method, segment, path, json=None):
        asked.append((segment.broker, path))
        return {"taken": 0}
    monkeypatch.setattr(node.reader.peers, "request", request)
    node.pop.states[KEY] = QueueState(KEY, 2, 0)
    node.routes.update(moved_to_b2())
    assert (await node.pop.freeze(KEY, 6, caller="b2"))["found"]
    await until(lambda: KEY not in node.pop._handing)
    assert asked == [] and not node.pop._chores.running()


async def test_a_frozen_head_keeps_what_it_hands_over_until_the_new_head_has_an_address_and_asks_nobody_if_back(
        node, monkeypatch):
    """The hand-over's question goes to the head the routes name, once they give its address (a restart that has
    not followed the routes yet, or an address not known yet: asked again later); its deliveries stay here, refused,
    until it answers. A head back on this broker is asked nothing: the next pop takes the state over here."""
    monkeypatch.setattr(service_mod, "DLQ_RETRY_MS", 50)
    asked = []

    async def request(method, segment, path, json=None):
        asked.append((segment.broker, path, json))
        return {"taken": 0}
    monkeypatch.setattr(node.reader.peers, "request", request)
    await node.writer.send("t", 0, [{"body": "a"}, {"body": "b"}])
    a, b = await pop(node, 2)
    st = node.pop.states[KEY]
    await until(lambda: all(d.written for d in st.in_flight.values()) and not node.pop.journal._changed)
    node.routes.update(moved_to_b2(address=None))
    await node.pop.freeze(KEY, 6, caller="b2")
    await asyncio.sleep(0.3)
    assert asked == [] and sorted(st.in_flight) == [0, 1] and KEY in node.pop._handing, "no address: kept, retried"
    node.routes.update(moved_to_b2(7))
    await until(lambda: not st.in_flight)
    assert asked == [("b2", "/v1/pop-adopt/g/t/0", {"deliveries": []})]
    await until(lambda: KEY not in node.pop._handing)
    assert [r["code"] for r in await node.pop.ack("g", [a.handle, b.handle])] == ["HANDLE_EXPIRED"] * 2
    assert (journal_mod.load(node.pop.journal.path)[0][KEY].in_flight) == {}, "dropped durably"


async def test_a_frozen_head_the_queue_came_back_to_asks_nobody_and_the_next_pop_delivers_its_deliveries(
        node, monkeypatch):
    monkeypatch.setattr(service_mod, "DLQ_RETRY_MS", 50)
    asked = []

    async def request(method, segment, path, json=None):
        asked.append((segment.broker, path))
        raise ApiError("b2 is not ready", code="CATCHING_UP", status=503)
    monkeypatch.setattr(node.reader.peers, "request", request)
    await node.writer.send("t", 0, [{"body": "a"}])
    [a] = await pop(node, 1)
    node.routes.update(moved_to_b2())
    await node.pop.freeze(KEY, 6, caller="b2")
    await until(lambda: len(asked) >= 2)
    node.routes.update(route(7, [seg(0, "b1", 0, 3, "sealed"), seg(1, "b2", 3, 3, "sealed", 3),
                                 seg(2, "b1", 3, None, "active", 3)]))
    await until(lambda: KEY not in node.pop._handing)
    count = len(asked)
    await asyncio.sleep(0.2)
    assert len(asked) == count, "back here: nobody asked again"
    assert 0 in node.pop.states[KEY].in_flight, "kept for the next pop here"


async def test_adopt_is_refused_by_name_where_the_queue_is_not_led_or_to_a_broker_of_no_older_gen(node):
    node.routes.update(moved_to_b2())
    assert await refused(node.pop.adopt(KEY, [[0, 1]], caller="b2")) == (
        409, "NOT_LEADER", NOT_HELD, {"topic": "t", "queue": 0, "broker": "b2", "address": ADDRESS})
    # b1 leads gen 2; b3 holds a copy of gen 2 only, b2 led gen 1
    node.routes.update(route(7, [seg(0, "b1", 0, 3, "sealed"), seg(1, "b2", 3, 3, "sealed", 3),
                                 seg(2, "b1", 3, None, "active", 3, replicas=["b1", "b3"], in_sync=["b1", "b3"])]))
    assert await refused(node.pop.adopt(KEY, [[0, 1]], caller="b3")) == (
        403, "PERMISSION_DENIED", "broker 'b3' may not hand over deliveries of queue 0 of 't': it never held an "
        "older gen of it", {"caller": "b3", "allowed": ["b1", "b2"]})


async def test_adopt_on_a_head_whose_state_is_frozen_at_its_gen_is_refused_naming_the_head(node):
    st = node.pop.states[KEY] = QueueState(KEY, 0, 0)
    st.frozen = True
    assert await refused(node.pop.adopt(KEY, [[0, 1]])) == (
        409, "NOT_LEADER", NOT_HELD, {"topic": "t", "queue": 0, "broker": "b1", "address": ADDRESS})


async def test_adopt_waits_for_a_pop_of_its_queue_and_its_deliveries_are_durable_and_wake_a_parked_pop(node):
    await node.writer.send("t", 0, [{"body": f"m{i}"} for i in range(3)])
    got = await pop(node, 3)
    assert all(r["ok"] for r in await node.pop.ack("g", [got[1].handle, got[2].handle]))
    async with node.pop.locks.hold(KEY):
        adopting = asyncio.create_task(node.pop.adopt(KEY, [[1, 3]]))
        await asyncio.sleep(0.2)
        assert not adopting.done(), "waits for the key's lock"
    assert await adopting == 1
    assert node.pop.states[KEY].in_flight[1].attempt == 3
    assert journal_mod.load(node.pop.journal.path)[0][KEY].in_flight[1].attempt == 3, "on disk when answered"
    assert [(m.offset, m.attempt) for m in await pop(node, 5)] == [(1, 4)]
    parked = asyncio.create_task(node.pop.pop("t", "g", 5, 60_000, 0, False, 8_000))
    await until(lambda: node.pop._waiters == 1)
    started = time.monotonic()
    assert await node.pop.adopt(KEY, [[2, 2]]) == 1
    [again] = await asyncio.wait_for(parked, 10)
    assert (again.offset, again.attempt) == (2, 3) and time.monotonic() - started < 4, "woken, not timed out"


async def test_an_ack_or_a_new_invisible_time_below_min_insync_is_refused_naming_which(node):
    await node.writer.send("t", 0, [{"body": "a"}, {"body": "b"}])
    a, b = await pop(node, 2)
    below = route(6, [seg(0, "b1", 0, None, "active", replicas=["b1", "b2"], in_sync=["b1"])])
    below["min_insync"] = 2
    node.routes.update(below)
    status, code, message, _ = await refused(node.pop.ack("g", [a.handle]))
    assert (status, code) == (503, "NOT_ENOUGH_REPLICAS") and "the ack is refused" in message, message
    status, code, message, _ = await refused(node.pop.change_invisible("g", b.handle, 60_000))
    assert (status, code) == (503, "NOT_ENOUGH_REPLICAS") and "the change of invisible time is refused" in message
    assert sorted(node.pop.states[KEY].in_flight) == [0, 1], "nothing applied"


async def test_a_new_invisible_time_is_on_disk_when_answered(node):
    await node.writer.send("t", 0, [{"body": "a"}])
    [a] = await pop(node, 1)
    await until(lambda: node.pop.states[KEY].in_flight[0].written and not node.pop.journal._changed)
    before = service_mod.now_ms()
    newer = await node.pop.change_invisible("g", a.handle, 600_000)
    written = journal_mod.load(node.pop.journal.path)[0][KEY].in_flight[0]
    assert written.deadline_ms >= before + 600_000 and written.seq == node.pop.states[KEY].in_flight[0].seq
    assert newer != a.handle


async def test_a_handle_a_new_invisible_time_superseded_stays_refused_once_retention_took_its_message(node,
                                                                                                   monkeypatch):
    """The delivery given a new invisible time leaves without an ack (its message deleted by retention before it
    came due again): the broker remembers the handle it superseded, and refuses it."""
    await node.writer.send("t", 0, [{"body": "a"}])
    [a] = await pop(node, 1)
    await node.pop.change_invisible("g", a.handle, 50)
    st = node.pop.states[KEY]
    await until(lambda: 0 in st.ready)
    base.answer_reads(node, monkeypatch, [{"messages": [], "next_offset": 1, "min_offset": 1, "max_offset": 1}])
    assert await pop(node, 1) == [] and not st.in_flight, "gone: nothing to deliver"
    assert await node.pop.ack("g", [a.handle]) == [{"handle": a.handle, "ok": False, "code": "HANDLE_EXPIRED"}]


async def test_a_hand_over_the_new_head_answered_at_once_ends_at_once(node, monkeypatch):
    async def request(method, segment, path, json=None):
        return {"taken": 0}
    monkeypatch.setattr(node.reader.peers, "request", request)
    await node.writer.send("t", 0, [{"body": "a"}])
    await pop(node, 1)
    node.routes.update(moved_to_b2())
    await node.pop.freeze(KEY, 6, caller="b2")
    await until(lambda: not node.pop.states[KEY].in_flight)
    await until(lambda: KEY not in node.pop._handing, 0.8 * service_mod.DLQ_RETRY_MS / 1000)
