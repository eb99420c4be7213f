"""Pop's bounds on a real broker node in this process (its real store, writer, reader, journal and reviver; routes
given directly, as the watch stream would): too many in flight per queue is 409 TOO_MANY_IN_FLIGHT, too many parked
long polls is 503 TOO_MANY_WAITERS, and a pop whose queue is busy with another pop never shares a delivery.
The limits are lowered here so the test stays small; tests/test_pop.py covers the behaviour over HTTP."""

from __future__ import annotations

import asyncio
import time

import pytest

from broker.pop import service as service_mod
from wire import route as route_model
from wire.errors import ApiError


def route(version: int = 5) -> dict:
    seg = route_model.segment_json(gen=0, broker="b1", address="http://127.0.0.1:1", physical_queue="t.q0.g0",
                                   physical_start=0, logic_start=0, logic_end=None, state="active",
                                   budget_end=1_000_000)
    return route_model.route_json(topic="t", version=version, slots=16, order="best_tried", config={},
                                  slot_table=[[0, 16, 0]], slot_table_version=version, barriers=[],
                                  queues=[route_model.queue_json(0, True, [seg])])


@pytest.fixture
async def node(broker_node):
    broker_node.routes.update(route())
    await broker_node.pop.start()
    try:
        yield broker_node
    finally:
        await broker_node.pop.stop()


async def test_a_queue_full_of_invisible_messages_refuses_more_until_some_are_acked(node, monkeypatch):
    monkeypatch.setattr(service_mod, "IN_FLIGHT_PER_QUEUE_MAX", 5)
    await node.writer.send("t", 0, [{"body": f"m{i}"} for i in range(8)])
    got = await node.pop.pop("t", "g", 100, 60_000, None, False, 0)
    assert [m.offset for m in got] == [0, 1, 2, 3, 4]
    with pytest.raises(ApiError) as e:
        await node.pop.pop("t", "g", 100, 60_000, None, False, 0)
    assert (e.value.status, e.value.code) == (409, "TOO_MANY_IN_FLIGHT")
    assert [r["ok"] for r in await node.pop.ack("g", [got[0].handle, got[1].handle])] == [True, True]
    assert [m.offset for m in await node.pop.pop("t", "g", 100, 60_000, 0, False, 0)] == [5, 6]


async def test_long_polls_beyond_the_limit_are_refused_at_once(node, monkeypatch):
    monkeypatch.setattr(service_mod, "POP_WAITERS_MAX", 1)
    parked = asyncio.create_task(node.pop.pop("t", "g", 1, 60_000, None, False, 5_000))
    await asyncio.sleep(0.1)
    started = time.monotonic()
    with pytest.raises(ApiError) as e:
        await node.pop.pop("t", "g", 1, 60_000, None, False, 5_000)
    assert (e.value.status, e.value.code) == (503, "TOO_MANY_WAITERS") and time.monotonic() - started < 1
    await node.writer.send("t", 0, [{"body": "wake"}])
    assert [m.offset for m in await asyncio.wait_for(parked, 5)] == [0], "a send wakes the parked pop"


async def test_pops_racing_on_one_queue_never_share_a_delivery(node):
    await node.writer.send("t", 0, [{"body": f"m{i}"} for i in range(50)])
    results = await asyncio.gather(*(node.pop.pop("t", "g", 7, 60_000, q, False, 0)
                                     for q in (None, 0) * 6))
    seen = [m.offset for r in results for m in r]
    assert len(seen) == len(set(seen)) and set(seen) <= set(range(50))



async def test_each_acked_handle_gets_its_own_answer_and_recent_outcomes_are_remembered_oldest_forgotten_first(
        node, monkeypatch):
    from broker.pop.handles import Handle
    monkeypatch.setattr(service_mod, "ACK_OUTCOMES_REMEMBERED_MAX", 2)
    await node.writer.send("t", 0, [{"body": f"m{i}"} for i in range(3)])
    h0, h1, h2 = [m.handle for m in await node.pop.pop("t", "g", 3, 60_000, None, False, 0)]
    unknown_queue = node.pop.codec.encode("g", Handle("t", 7, 0, 1))
    assert await node.pop.ack("g", ["garbage", unknown_queue, 5]) == [
        {"handle": "garbage", "ok": False, "code": "INVALID_HANDLE"},
        {"handle": unknown_queue, "ok": False, "code": "INVALID_HANDLE"},
        {"handle": None, "ok": False, "code": "INVALID_HANDLE"}]
    assert (await node.pop.ack("other", [h2]))[0]["code"] == "INVALID_HANDLE", "a handle is its group's"
    newer = await node.pop.change_invisible("g", h0, 60_000)
    assert await node.pop.ack("g", [newer, h1, h1]) == [
        {"handle": newer, "ok": True}, {"handle": h1, "ok": True}, {"handle": h1, "ok": True}]
    # remembered: offsets 0 and 1 (two, the bound): the superseded handle of offset 0 is told it expired
    assert await node.pop.ack("g", [h0]) == [{"handle": h0, "ok": False, "code": "HANDLE_EXPIRED"}]
    assert await node.pop.ack("g", [h2]) == [{"handle": h2, "ok": True}]
    # a third outcome: offset 0's, the oldest, is forgotten; done for good, a late ack of it is answered ok
    assert await node.pop.ack("g", [h0]) == [{"handle": h0, "ok": True}]


def two_queue_route(version: int = 5) -> dict:
    segs = [route_model.segment_json(gen=0, broker="b1", address="http://127.0.0.1:1", physical_queue=f"t.q{q}.g0",
                                     physical_start=0, logic_start=0, logic_end=None, state="active",
                                     budget_end=1_000_000) for q in range(2)]
    return route_model.route_json(topic="t", version=version, slots=16, order="best_tried", config={},
                                  slot_table=[[0, 8, 0], [8, 16, 1]], slot_table_version=version, barriers=[],
                                  queues=[route_model.queue_json(q, True, [segs[q]]) for q in range(2)])


async def test_a_pop_gathers_over_the_queues_up_to_its_max_and_redeliveries_come_before_new_messages(broker_node):
    node = broker_node
    node.routes.update(two_queue_route())
    await node.pop.start()
    try:
        for q in range(2):
            await node.writer.send("t", q, [{"body": f"q{q}m{i}"} for i in range(3)])
        first = await node.pop.pop("t", "g", 4, 60_000, None, False, 0)
        rest = await node.pop.pop("t", "g", 10, 60_000, None, False, 0)
        got = [(m.queue, m.offset, m.attempt) for m in first + rest]
        assert len(first) == 4 and len(rest) == 2, "at most max, and the rest next time"
        assert sorted(got) == [(q, o, 1) for q in range(2) for o in range(3)], "each message once, over both queues"
        assert await node.pop.pop("t", "g", 10, 60_000, None, False, 0) == []
        await node.writer.send("t", 1, [{"body": "late"}])
        assert [(m.queue, m.offset) for m in await node.pop.pop("t", "g", 10, 60_000, 0, False, 0)] == [], \
            "a pop naming queue 0 takes nothing of queue 1"
        [late] = await node.pop.pop("t", "g", 10, 50, 1, False, 0)   # invisible for 50 ms only
        assert (late.queue, late.offset, late.attempt) == (1, 3, 1)
        await node.writer.send("t", 0, [{"body": "new"}])
        state = node.pop.states[("g", "t", 1)]
        deadline = time.monotonic() + 5
        while 3 not in state.ready and time.monotonic() < deadline:   # its invisible time ran out: due again
            await asyncio.sleep(0.02)
        again = await node.pop.pop("t", "g", 1, 60_000, None, False, 0)
        assert [(m.queue, m.offset, m.attempt) for m in again] == [(1, 3, 2)], "the redelivery before the new one"
        assert [(m.queue, m.offset) for m in await node.pop.pop("t", "g", 1, 60_000, None, False, 0)] == [(0, 3)]
    finally:
        await node.pop.stop()
