"""The leader's side of committed offsets on copies (broker/replication/offsets.py), in process with the real route
table, tracker and offset store; the copies are a recording stand-in for ``Peers.call``."""

from __future__ import annotations

import asyncio

from broker.offsets import Committed, OffsetStore
from broker.peers import Unreachable
from broker.replication.leader import ReplicaTracker
from broker.replication.offsets import OffsetCopies, decode
from broker.routing import RouteTable
from wire import route as route_model

WAIT_S = 10.0


def route(version: int, gen: int, broker: str, in_sync: list[str]) -> dict:
    older = [route_model.segment_json(gen=g, broker="b2", address="http://127.0.0.1:9", physical_queue=f"t.q0.g{g}",
                                      physical_start=0, logic_start=0, logic_end=0, state="sealed", budget_end=10**9,
                                      replicas=["b1", "b2", "b3"], in_sync=["b1", "b2"]) for g in range(gen)]
    head = route_model.segment_json(gen=gen, broker=broker, address="http://127.0.0.1:9",
                                    physical_queue=f"t.q0.g{gen}", physical_start=0, logic_start=0, logic_end=None,
                                    state="active", budget_end=10**9, replicas=["b1", "b2", "b3"], in_sync=in_sync)
    return route_model.route_json(topic="t", version=version, slots=16, order="best_tried", config={},
                                  slot_table=[[0, 16, 0]], slot_table_version=1, barriers=[], replicas=3,
                                  min_insync=2, queues=[route_model.queue_json(0, True, [*older, head])])


class Copies:
    """Stands in for the other brokers: records what each was sent; ``down`` ones do not answer."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str, list]] = []   # (copy, physical queue, commits)
        self.down: set[str] = set()

    async def call(self, method, broker, address, path, json=None):
        if broker in self.down:
            raise Unreachable("down")
        _, _, _, values = decode(json)
        self.sent.append((broker, f"t.q0.g{json['leader_gen']}", [(k[0], v.offset) for k, v in values]))
        return {"stored": len(values)}


async def until(what, timeout_s: float = WAIT_S) -> None:
    async with asyncio.timeout(timeout_s):
        while not what():
            await asyncio.sleep(0.01)


async def test_a_head_this_broker_comes_to_lead_sends_its_copies_in_sync_the_queue_s_commits_once(tmp_path):
    """The chaos runner, seed 49: a commit made under gen 4 stood on b1 and b2; gen 5 opened with b3 in sync (meta
    names a new gen's copies in sync at once: it holds no records yet), then gen 6 on b2 with b3; b1 and b2 lost
    their disks and b3 read the commit back older. A head led here sends each copy in sync the queue's commits,
    older gens' among them, once per gen; one a copy did not take is sent again at the next route change."""
    routes, copies = RouteTable("b1"), Copies()
    store = OffsetStore(str(tmp_path / "offsets.log"))
    try:
        await store.store([(("g", "t", 0), Committed(325, 4, 1))])   # taken as gen 4's copy
        oc = OffsetCopies("b1", routes, ReplicaTracker("b1", routes, lambda seg: 0), store, copies)
        routes.update(route(1, 5, "b2", ["b2", "b1", "b3"]))   # a copy here: nothing to send
        oc.route_changed("t")
        await asyncio.sleep(0.05)
        assert copies.sent == []
        copies.down = {"b3"}
        routes.update(route(2, 6, "b1", ["b1", "b2", "b3"]))   # led here now (a failover)
        oc.route_changed("other")
        await asyncio.sleep(0.05)
        assert copies.sent == [], "another topic's route change looks at that topic's heads only"
        oc.route_changed("t")
        await until(lambda: len(copies.sent) == 1 and not oc._syncing)
        assert copies.sent == [("b2", "t.q0.g6", [("g", 325)])]
        routes.update(route(3, 6, "b1", ["b1", "b2", "b3"]))
        copies.down = set()
        oc.route_changed("t")   # b3 did not take it: sent again, to both
        await until(lambda: len(copies.sent) == 3 and not oc._syncing)
        assert sorted(copies.sent[1:]) == [("b2", "t.q0.g6", [("g", 325)]), ("b3", "t.q0.g6", [("g", 325)])]
        oc.route_changed("t")
        await asyncio.sleep(0.05)
        assert len(copies.sent) == 3, "once per gen"
        routes.update(route(4, 7, "b1", ["b1", "b3"]))   # a new gen led here: again, to its copies in sync
        oc.route_changed("t")
        await until(lambda: len(copies.sent) == 4 and not oc._syncing)
        assert copies.sent[3] == ("b3", "t.q0.g7", [("g", 325)])
        oc.stop()
    finally:
        store.close()
