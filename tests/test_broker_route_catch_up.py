"""A send whose sender read a newer route than the broker holds (X-Route-Version) is decided on that route.

Meta answers a client's route read before its watch stream brings the same change to the broker: the producer that
read a remapped queue's new head writable and sent to it at once was refused SEALING by the very broker the route
named (the CI run of 8760258), and a real producer then waits up to SEALING_WAIT_S_MAX for a route change that never
comes. The broker waits (bounded, broker/routing.py ``reach``) for the version its sender read.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from broker import routing
from broker.routing import RouteTable
from broker.session import MetaSession
from broker.storage import QueueStore
from broker.writes import Writer
from wire import route as route_model
from wire.errors import ApiError


def _route(version: int, remapped: bool) -> dict:
    """Topic t, one queue: its gen 0 open on b1; ``remapped``: gen 0 sealed at 0 and gen 1 open on b2."""
    gen0 = route_model.segment_json(gen=0, broker="b1", address="http://127.0.0.1:1", physical_queue="t.q0.g0",
                                    physical_start=0, logic_start=0, logic_end=0 if remapped else None,
                                    state="sealed" if remapped else "active", budget_end=1_000_000)
    segments = [gen0]
    if remapped:
        segments.append(route_model.segment_json(gen=1, broker="b2", address="http://127.0.0.1:2",
                                                 physical_queue="t.q0.g1", physical_start=0, logic_start=0,
                                                 logic_end=None, state="active", budget_end=1_000_000))
    return route_model.route_json(topic="t", version=version, slots=16, order="best_tried", config={},
                                  slot_table=[[0, 16, 0]], slot_table_version=1, barriers=[],
                                  queues=[route_model.queue_json(0, True, segments)])


@pytest.fixture
async def b2(tmp_path):
    """Broker b2's writer over a real queue store, its session active, its routes at version 1 (b1 leads)."""
    routes = RouteTable("b2")
    routes.update(_route(1, remapped=False))
    session = MetaSession(epoch=1, state="active", session_timeout_ms=60_000, last_ack_sent=time.monotonic())
    with QueueStore(str(tmp_path / "root")) as store:
        writer = Writer("b2", store, routes, session, None)
        try:
            yield writer
        finally:
            writer.stop()


async def test_a_send_whose_sender_read_the_remap_waits_for_it_and_is_stored(b2, monkeypatch):
    monkeypatch.setattr(routing, "ROUTE_CATCH_UP_WAIT_S", 60.0)   # a loaded machine's pause never ends the wait
    send = asyncio.create_task(b2.send("t", 0, [{"body": "x"}], sender_route_version=2))
    await asyncio.sleep(0.1)
    assert not send.done(), "decided on the route before the one its sender read"
    b2.routes.update(_route(2, remapped=True))   # the watch stream brings it
    assert await asyncio.wait_for(send, 10) == [0]


async def test_a_send_with_no_newer_route_is_decided_at_once(b2, monkeypatch):
    monkeypatch.setattr(routing, "ROUTE_CATCH_UP_WAIT_S", 60.0)   # a wait would show, whatever the load
    for version in (None, 1):
        started = time.monotonic()
        with pytest.raises(ApiError) as e:
            await b2.send("t", 0, [{"body": "x"}], sender_route_version=version)
        assert e.value.code == "NOT_LEADER" and time.monotonic() - started < routing.ROUTE_CATCH_UP_WAIT_S / 2


async def test_a_route_that_never_comes_is_waited_for_a_bounded_time_then_the_send_is_decided_on_the_one_held(
        b2, monkeypatch):
    monkeypatch.setattr(routing, "ROUTE_CATCH_UP_WAIT_S", 0.3)
    started = time.monotonic()
    with pytest.raises(ApiError) as e:
        await b2.send("t", 0, [{"body": "x"}], sender_route_version=7)
    took = time.monotonic() - started
    assert e.value.code == "NOT_LEADER"
    assert routing.ROUTE_CATCH_UP_WAIT_S * 0.9 <= took < routing.ROUTE_CATCH_UP_WAIT_S + 5, took


async def test_reach_counts_a_caught_up_and_a_deletion_as_followed_and_bounds_its_waiters(monkeypatch):
    routes = RouteTable("b2")
    assert await routes.reach(0, timeout_s=0)
    waiting = asyncio.create_task(routes.reach(5, timeout_s=10))
    await asyncio.sleep(0.01)
    routes.delete("gone", 3)
    await asyncio.sleep(0.01)
    assert not waiting.done(), "woke and returned before version 5"
    routes.caught_up(5)
    assert await asyncio.wait_for(waiting, 5) is True
    monkeypatch.setattr(routing, "ROUTE_WAITERS_MAX", 1)
    first = asyncio.create_task(routes.reach(6, timeout_s=10))
    await asyncio.sleep(0.01)
    started = time.monotonic()
    assert await routes.reach(6, timeout_s=10) is False, "one waiter past the bound waited"
    assert time.monotonic() - started < 1
    routes.caught_up(6)
    assert await asyncio.wait_for(first, 5) is True
    assert routes._advanced.waiting == 0
