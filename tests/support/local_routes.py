"""Routes for a broker node run in the test's own process (the ``broker_node`` fixture), set directly with
``node.routes.update(...)`` as the watch stream would."""

from __future__ import annotations

from wire import route as route_model


def one_queue_route(version: int, heads: list[tuple[str, int]], budget_end: int = 1_000_000) -> dict:
    """Topic "t", one queue whose segments are ``heads`` ((broker, gen), oldest first), 10 messages each; the head
    may write up to ``budget_end``."""
    segs = []
    for i, (broker, gen) in enumerate(heads):
        last = i == len(heads) - 1
        segs.append(route_model.segment_json(
            gen=gen, broker=broker, address=f"http://127.0.0.1:{9 + i}", physical_queue=f"t.q0.g{gen}",
            physical_start=0, logic_start=10 * i, logic_end=None if last else 10 * i + 10,
            state="active" if last else "sealed", budget_end=budget_end))
    return route_model.route_json(topic="t", version=version, slots=16, order="best_tried", config={},
                                  slot_table=[[0, 16, 0]], slot_table_version=version, barriers=[],
                                  queues=[route_model.queue_json(0, True, segs)])
