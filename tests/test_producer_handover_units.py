"""broker/replication/producer_handover.py alone, without brokers: what it remembers of the segments it holds is
forgotten once the routes name them no more (bounded by the routes, not by the broker's history)."""

from __future__ import annotations

from broker.replication.producer_handover import PRUNE_AFTER_MIN, ProducerHandover
from broker.routing import RouteTable
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
