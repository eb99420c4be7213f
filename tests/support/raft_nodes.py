"""Three real MetaSyncObj nodes in the test's own process: real pysyncobj, real TCP on loopback, no HTTP."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time

from meta.raft.node import LoopBridge, MetaSyncObj, RaftNode, RaftTuning
from ops import devcluster


LOOP_THREAD_WAIT_S = 15.0


class LoopThread:
    """An event loop on a thread of its own, for nodes that must not share the test's loop (so that a message can
    arrive while another node ticks, as between processes)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="other-loop", daemon=True)
        self._thread.start()

    def call(self, fn, *args):
        """``fn(*args)`` on the loop's thread, inside the loop (as a callback of it would run), and its result."""
        async def run():
            return fn(*args)
        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(LOOP_THREAD_WAIT_S)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(LOOP_THREAD_WAIT_S)
        assert not self._thread.is_alive(), "the loop's thread did not stop"
        self.loop.close()


def start_node(data_dir, addresses: list[str], i: int, secret: str, tuning: RaftTuning | None = None) -> MetaSyncObj:
    """Node ``i`` of ``addresses``, ticking on the running loop."""
    node = MetaSyncObj(addresses[i], [a for a in addresses if a != addresses[i]], str(data_dir), secret,
                       tuning or RaftTuning(), lambda version, changed: None, LoopBridge())
    node.bridge.loop = asyncio.get_running_loop()
    node.start()
    return node


def start_nodes(base_dir, secret: str, journal_sync: str = "fsync",
                tuning: RaftTuning | None = None) -> list[MetaSyncObj]:
    """On the running loop (an async test's): each node ticks on it."""
    tuning = dataclasses.replace(tuning or RaftTuning(), journal_sync=journal_sync)
    base = devcluster.free_base_port()
    addresses = [f"127.0.0.1:{base + i}" for i in range(3)]
    return [start_node(base_dir / f"n{i}", addresses, i, secret, tuning) for i in range(len(addresses))]


async def leader_of(nodes: list[MetaSyncObj], timeout_s: float) -> tuple[MetaSyncObj, RaftNode]:
    """The leader once there is one and it has committed its bootstrap membership, and a RaftNode on the running
    loop to propose through it. A new leader proposes that entry a tick or more after it wins: a test that started
    before would see it land after its own first entries, shifting every index it reads."""
    deadline = time.monotonic() + timeout_s
    while (leader := settled_leader(nodes)) is None:
        assert time.monotonic() < deadline, "no leader with a committed membership among the in-process nodes"
        await asyncio.sleep(0.05)
    loop = asyncio.get_running_loop()
    leader.bridge.loop = loop
    return leader, RaftNode(leader, loop, offset_budget=1000)


def settled_leader(nodes: list[MetaSyncObj]) -> MetaSyncObj | None:
    """The leader, once it has committed its bootstrap membership (leader_of); None before."""
    for n in nodes:
        index = n.membership_status()["membership_index"]
        if n.is_leader() and index is not None and n.raftCommitIndex >= index:
            return n
    return None


async def all_applied(nodes: list[MetaSyncObj], leader: MetaSyncObj, timeout_s: float) -> None:
    """Until every node applied what the leader has (a follower may lag a tick)."""
    deadline = time.monotonic() + timeout_s
    while any(n.applied_index < leader.applied_index for n in nodes):
        assert time.monotonic() < deadline, [n.applied_index for n in nodes]
        await asyncio.sleep(0.05)
