"""broker/replication/producer_handover.py alone, without brokers: what it remembers of the segments it holds is
forgotten once the routes name them no more (bounded by the routes, not by the broker's history)."""

from __future__ import annotations

import asyncio

from broker.producers import Batch
from broker.replication.producer_handover import PRUNE_AFTER_MIN, ProducerHandover, decode_answer, encode_ask
from broker import routing
from broker.routing import RouteTable, segment_of
from wire import route as route_model


def topic_route(topic: str, queues: int, version: int) -> dict:
    """``topic`` with ``queues`` queues, each one open first segment led by b1."""
    return route_model.route_json(
        topic=topic, version=version, slots=16, order="best_tried", config={}, slot_table=[[0, 16, 0]],
        slot_table_version=version, barriers=[],
        queues=[route_model.queue_json(q, True, [route_model.segment_json(
            gen=0, broker="b1", address="http://127.0.0.1:1", physical_queue=f"{topic}.q{q}.g0", physical_start=0,
            logic_start=0, logic_end=None, state="active", budget_end=1_000_000, replicas=["b1"], in_sync=["b1"],
            sealer=None)]) for q in range(queues)])


def test_segments_of_a_deleted_topic_are_forgotten_once_the_remembered_ones_pass_the_bound():
    routes = RouteTable("b1")
    handover = ProducerHandover("b1", routes, None, lambda seg: False, lambda t, q: [], lambda t, q, b: None)
    routes.update(topic_route("old", PRUNE_AFTER_MIN - 1, 1))
    handover.route_changed("old")   # a queue's first segment: nothing to take, its batches are here
    routes.delete("old", 2)
    routes.update(topic_route("new", 1, 3))
    handover.route_changed("new")
    assert len(handover._taken) == PRUNE_AFTER_MIN, "at the bound: no scan yet"
    routes.update(topic_route("newer", 1, 4))
    handover.route_changed("newer")
    assert handover._taken == {"new.q0.g0", "newer.q0.g0"}, "past it: the deleted topic's segments are gone"


def test_a_deleted_topic_leaves_no_segment_hosted_or_copied():
    """RouteTable.delete read the topic's segments after dropping its route, found none, and left them in hosted
    and copies for good (their per-queue state never forgotten by the writer)."""
    routes = RouteTable("b1")
    routes.update(topic_route("old", 3, 1))
    assert routes.delete("old", 2) == {"old.q0.g0", "old.q1.g0", "old.q2.g0"}
    assert routes.hosted == {} and routes.copies == {}


def _remapped(version: int) -> dict:
    """Topic t, one queue: gen 0 on b1 sealed at 3, gen 1 open on b2."""
    segs = [route_model.segment_json(gen=0, broker="b1", address="http://127.0.0.1:1", physical_queue="t.q0.g0",
                                     physical_start=0, logic_start=0, logic_end=3, state="sealed", budget_end=100),
            route_model.segment_json(gen=1, broker="b2", address="http://127.0.0.1:2", physical_queue="t.q0.g1",
                                     physical_start=0, logic_start=3, logic_end=None, state="active", budget_end=100)]
    return route_model.route_json(topic="t", version=version, slots=16, order="best_tried", config={},
                                  slot_table=[[0, 16, 0]], slot_table_version=1, barriers=[],
                                  queues=[route_model.queue_json(0, True, segs)])


async def test_a_holder_answers_on_routes_at_least_as_new_as_the_asker_s(monkeypatch):
    """The new head's broker learns of the previous segment's seal before its holder: asked then, the holder found
    it still open, answered nothing, and the head's idempotent sends waited RETRY_S (0.5 s) for the next ask."""
    monkeypatch.setattr(routing, "ROUTE_CATCH_UP_WAIT_S", 60.0)   # a loaded machine's pause never ends the wait
    routes = RouteTable("b1")
    routes.update(topic_route("t", 1, 1))   # gen 0 open on b1: its own batches
    stored = Batch(7, 0, 0, 3, 0)
    holder = ProducerHandover("b1", routes, None, lambda seg: seg.state == "sealed", lambda t, q: [stored],
                              lambda t, q, b: None)
    holder.route_changed("t")
    asked = _remapped(2)
    head, previous = (segment_of("t", 0, s) for s in reversed(asked["queues"][0]["segments"]))
    ask = encode_ask([(head, previous)], route_version=2)
    answering = asyncio.create_task(holder.answer(ask["queues"], ask["route_version"]))
    await asyncio.sleep(0.05)
    assert not answering.done(), "answered on routes older than the asker's"
    routes.update(asked)   # the seal reaches the holder
    assert decode_answer(await asyncio.wait_for(answering, 5)) == {("t", 0): [stored]}
    assert decode_answer(await holder.answer(ask["queues"], 0)) == {("t", 0): [stored]}, "an older asker: at once"
