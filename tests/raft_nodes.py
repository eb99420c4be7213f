"""Three real MetaSyncObj nodes in the test's own process: real pysyncobj, real TCP on loopback, no HTTP."""

from __future__ import annotations

import asyncio
import dataclasses
import time

from meta.raft_node import LoopBridge, MetaSyncObj, RaftNode, RaftTuning
from ops import devcluster


def start_nodes(base_dir, secret: str, journal_sync: str = "fsync",
                tuning: RaftTuning | None = None) -> list[MetaSyncObj]:
    tuning = dataclasses.replace(tuning or RaftTuning(), journal_sync=journal_sync)
    base = devcluster.free_base_port()
    addresses = [f"127.0.0.1:{base + i}" for i in range(3)]
    nodes = []
    for i, address in enumerate(addresses):
        node = MetaSyncObj(address, [a for a in addresses if a != address], str(base_dir / f"n{i}"), secret,
                           tuning, lambda version, changed: None, LoopBridge())
        node.start()
        nodes.append(node)
    return nodes


async def leader_of(nodes: list[MetaSyncObj], timeout_s: float) -> tuple[MetaSyncObj, RaftNode]:
    """The leader once there is one, and a RaftNode on the running loop to propose through it."""
    deadline = time.monotonic() + timeout_s
    while not any(n.is_leader() for n in nodes):
        assert time.monotonic() < deadline, "no leader among the in-process nodes"
        await asyncio.sleep(0.05)
    leader = next(n for n in nodes if n.is_leader())
    loop = asyncio.get_running_loop()
    leader.bridge.loop = loop
    return leader, RaftNode(leader, loop, offset_budget=1000)


async def all_applied(nodes: list[MetaSyncObj], leader: MetaSyncObj, timeout_s: float) -> None:
    """Until every node applied what the leader has (a follower may lag a tick)."""
    deadline = time.monotonic() + timeout_s
    while any(n.applied_index < leader.applied_index for n in nodes):
        assert time.monotonic() < deadline, [n.applied_index for n in nodes]
        await asyncio.sleep(0.05)
