"""A broker leading queue 0 of topic t with the real route table and replica tracker (broker/replication/leader.py),
and the routes of that queue in sync and between a failover and its seal report: for tests of what the leader
tracks of its followers and of what waits on them (tests/test_replica_tracker.py, tests/test_pop_journal_rounds.py)."""

from __future__ import annotations

from broker.replication.leader import ReplicaTracker
from broker.routing import RouteTable
from wire import route as route_model


def route(version: int, in_sync: list[str], min_insync: int = 2) -> dict:
    seg = route_model.segment_json(gen=0, broker="b1", address="http://127.0.0.1:9", physical_queue="t.q0.g0",
                                   physical_start=0, logic_start=0, logic_end=None, state="active", budget_end=10**9,
                                   replicas=["b1", "b2", "b3"], in_sync=in_sync)
    return route_model.route_json(topic="t", version=version, slots=16, order="best_tried", config={},
                                  slot_table=[[0, 16, 0]], slot_table_version=1, barriers=[], replicas=3,
                                  min_insync=min_insync, queues=[route_model.queue_json(0, True, [seg])])


def failed_over(version: int, lost: str, elected: str) -> dict:
    """Queue 0 of t between a failover and its seal report: gen 0, led by ``lost``, being sealed by ``elected``,
    which leads gen 1 (its start not decided yet)."""
    sealing = route_model.segment_json(gen=0, broker=lost, address="http://127.0.0.1:9", physical_queue="t.q0.g0",
                                       physical_start=0, logic_start=0, logic_end=None, state="sealing",
                                       budget_end=10**9, replicas=[lost, elected], in_sync=[elected], sealer=elected)
    head = route_model.segment_json(gen=1, broker=elected, address="http://127.0.0.1:1", physical_queue="t.q0.g1",
                                    physical_start=0, logic_start=None, logic_end=None, state="active",
                                    budget_end=10**9, replicas=[elected, lost], in_sync=[elected])
    return route_model.route_json(topic="t", version=version, slots=16, order="best_tried", config={},
                                  slot_table=[[0, 16, 0]], slot_table_version=1, barriers=[],
                                  queues=[route_model.queue_json(0, False, [sealing, head])])


class Leader:
    def __init__(self, in_sync: list[str]):
        self.routes = RouteTable("b1")
        self.routes.update(route(1, in_sync))
        self.end = 0
        self.tracker = ReplicaTracker("b1", self.routes, lambda seg: self.end)

    @property
    def head(self):
        return self.routes.head("t", 0)

    def wanted(self, now: float) -> list[list[str]]:
        return [c["in_sync"] for c in self.tracker.changes_wanted(now)]
