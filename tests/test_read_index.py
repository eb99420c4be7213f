"""Reads by read index (meta/raft/read_index.py, issue 38) on three real raft nodes (MetaSyncObj, pysyncobj, Stator's
journal and transport over loopback TCP) in the test's process.

- They append nothing to the log: hundreds of them through every node leave every node's log where it was (each
  HTTP linearizable read appends a barrier entry, meta/reads.py says why it still does).
- They never return state older than an acknowledged write: a writer proposes through the leader while readers on
  every node wait for the read index and read the node's image; each read shows at least the newest write
  acknowledged before it was sent, and the node has applied at least what the leader had committed then.
"""

from __future__ import annotations

import asyncio
import itertools
import time

from meta.raft import pysyncobj_shim as shim
from meta.raft.node import MetaSyncObj, RaftNode
from tests.support.raft_nodes import all_applied, leader_of, start_nodes

READS = 300
RACE_S = 5.0
READERS_PER_NODE = 2
WAIT_S = 15.0            # a leader, and every node caught up (loaded 2-core machine)
READ_TIMEOUT_S = 5.0


def _faces(nodes: list[MetaSyncObj], loop: asyncio.AbstractEventLoop) -> list[RaftNode]:
    for n in nodes:
        n.bridge.loop = loop
    return [RaftNode(n, loop, offset_budget=1000) for n in nodes]


def _version(node: MetaSyncObj) -> int:
    with node.image_lock:
        return node.image_data["version"]


async def test_reads_by_read_index_append_nothing_to_the_log(tmp_path):
    nodes = start_nodes(tmp_path, "read-index-test-secret")
    try:
        leader, raft = await leader_of(nodes, WAIT_S)
        assert (await raft.propose({"type": "RegisterBroker", "broker": "b1", "address": "http://10.0.0.1:1"},
                                   None, "test"))["ok"]
        await all_applied(nodes, leader, WAIT_S)
        faces = _faces(nodes, asyncio.get_running_loop())
        before = [(shim.current_log_index(n), n.raftCommitIndex) for n in nodes]
        for face in itertools.islice(itertools.cycle(faces), READS):
            await face.read_index(READ_TIMEOUT_S)
        after = [(shim.current_log_index(n), n.raftCommitIndex) for n in nodes]
        assert after == before, f"{READS} reads by read index moved the logs: {before} -> {after}"
        served = sum(n.read_index_counts().served for n in nodes)
        assert served >= READS, served
    finally:
        for n in nodes:
            n.stop()


async def test_a_read_by_read_index_never_misses_an_acknowledged_write(tmp_path):
    nodes = start_nodes(tmp_path, "read-index-test-secret")
    try:
        leader, raft = await leader_of(nodes, WAIT_S)
        faces = _faces(nodes, asyncio.get_running_loop())
        acked: list[tuple[float, int]] = []   # (monotonic time of the answer, the leader's version then), in order
        stop = time.monotonic() + RACE_S
        seen = {"reads": 0, "after_a_write": 0}

        async def writer() -> None:
            for n in itertools.count(1):
                if time.monotonic() > stop:
                    return
                out = await raft.propose({"type": "RegisterBroker", "broker": "b1", "address": f"http://10.0.0.1:{n}"},
                                         None, "test")
                assert out["ok"], out
                acked.append((time.monotonic(), _version(leader)))

        async def reader(node: MetaSyncObj, face: RaftNode) -> None:
            while time.monotonic() < stop:
                sent = time.monotonic()
                floor = next((v for t, v in reversed(acked) if t < sent), 0)
                committed = leader.raftCommitIndex   # covers every write acknowledged before the read was sent
                await face.read_index(READ_TIMEOUT_S)
                version = _version(node)
                assert version >= floor, f"a read on {node.selfNode.address} saw version {version} after {floor}"
                assert node.applied_index >= committed, \
                    f"{node.selfNode.address} answered at applied index {node.applied_index}, below {committed}"
                seen["reads"] += 1
                seen["after_a_write"] += floor > 0

        await asyncio.gather(writer(), *(reader(n, f) for n, f in zip(nodes, faces) for _ in range(READERS_PER_NODE)))
        assert len(acked) > 20 and seen["after_a_write"] > 50, (len(acked), seen)
    finally:
        for n in nodes:
            n.stop()
