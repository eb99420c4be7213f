"""Reads by read index (meta/raft/read_index.py, issue 38): HTTP ``consistency=linearizable`` reads on three real
meta processes, and the read index itself on three real raft nodes (MetaSyncObj, pysyncobj, Stator's journal and
transport over loopback TCP) in the test's process.

- They append nothing to the log: hundreds of them through every node leave every node's log where it was (served
  by barrier entries before, each appended one).
- They never return state older than an acknowledged write: writers write through every node while readers on
  every node read; each read shows at least the newest write acknowledged before it was sent (and, in process, the
  node has applied at least what the leader had committed then).
- The leader's own wait for its apply thread (``RaftNode.applied_commit``, what a group heartbeat waits for): a
  follower can answer a write the leader has not applied yet; the wait returns only once the leader has.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time

from meta.raft import pysyncobj_shim as shim
from meta.raft.node import MetaSyncObj, RaftNode
from tests.support.meta_http import ok, wait_until
from tests.support.raft_nodes import all_applied, leader_of, start_nodes

READS = 300
RACE_S = 5.0
READERS_PER_NODE = 2
WAIT_S = 15.0            # a leader, and every node caught up (loaded 2-core machine)
READ_TIMEOUT_S = 5.0


async def _cluster(c, url: str, consistency: str = "serializable") -> dict:
    s, b, _ = await c.call("GET", f"{url}/v1/cluster?consistency={consistency}", "client", timeout_s=READ_TIMEOUT_S)
    assert s == 200, (url, s, b)
    return b


async def test_linearizable_http_reads_append_nothing_to_the_log(meta_cluster):
    c = meta_cluster
    # A write that starts no timer: a registered broker that never heartbeats is fenced by a log entry once its
    # session ends, which a slow run of the reads below outlasted
    await ok(c, "PUT", "/v1/groups/g/config", json={"lease_ms": 15000})
    # Every node has applied the write (the leader commits it, the followers hear the commit index)
    await wait_until(lambda: _same_commit_index(c), WAIT_S, "every node at one commit index")
    before = [(await _cluster(c, url))["commit_index"] for url in c.meta_urls]
    for url in itertools.islice(itertools.cycle(c.meta_urls), READS):
        assert (await _cluster(c, url, "linearizable"))["commit_index"] >= before[0]
    after = [(await _cluster(c, url))["commit_index"] for url in c.meta_urls]
    assert after == before, f"{READS} linearizable reads moved the logs: {before} -> {after}"
    served = 0
    for url in c.meta_urls:
        s, text, _ = await c.call("GET", f"{url}/metrics", None)
        served += sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                      if line.startswith('stator_meta_raft_read_index_total{kind="served"}'))
    assert served >= READS, served


async def _same_commit_index(c) -> bool | None:
    indexes = {(await _cluster(c, url))["commit_index"] for url in c.meta_urls}
    return True if len(indexes) == 1 else None


async def test_a_linearizable_http_read_never_misses_an_acknowledged_write(meta_cluster):
    c = meta_cluster
    await ok(c, "PUT", "/v1/brokers/b1", role="broker", json={"address": "http://127.0.0.1:1"})
    await ok(c, "POST", "/v1/topics", json={"topic": "t", "queues": 1, "brokers": ["b1"]}, expect=(201,))
    acked: list[tuple[float, int]] = []   # (monotonic time of the answer, its version), in answer order
    stop = time.monotonic() + RACE_S
    seen = {"reads": 0, "after_a_write": 0}

    async def writer(url: str) -> None:
        n = 0
        while time.monotonic() < stop:
            n += 1
            s, b, _ = await c.call("PUT", f"{url}/v1/topics/t/config", json={"n": str(n)}, timeout_s=READ_TIMEOUT_S)
            assert s == 200, (url, s, b)
            acked.append((time.monotonic(), b["version"]))

    async def reader(url: str) -> None:
        while time.monotonic() < stop:
            sent = time.monotonic()
            floor = max((v for t, v in acked if t < sent), default=0)
            version = (await _cluster(c, url, "linearizable"))["applied_version"]
            assert version >= floor, f"a linearizable read on {url} answered version {version} after {floor}"
            seen["reads"] += 1
            seen["after_a_write"] += floor > 0

    await asyncio.gather(*(writer(url) for url in c.meta_urls),
                         *(reader(url) for url in c.meta_urls for _ in range(READERS_PER_NODE)))
    assert len(acked) > 20 and seen["after_a_write"] > 50, (len(acked), seen)


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


async def test_the_leader_waits_for_its_apply_thread_to_hold_what_a_follower_acknowledged(tmp_path):
    nodes = start_nodes(tmp_path, "read-index-test-secret")
    gate = threading.Event()
    try:
        leader, raft = await leader_of(nodes, WAIT_S)
        await all_applied(nodes, leader, WAIT_S)
        assert await raft.applied_commit(0.001), "nothing committed is unapplied: no wait"
        follower = next(n for n in nodes if n is not leader)
        face = _faces([follower], asyncio.get_running_loop())[0]
        # The leader's apply thread stalls (a long apply, a snapshot's fork); its raft thread goes on committing.
        leader._applier.submit_call(lambda: gate.wait(WAIT_S))
        out = await face.propose({"type": "RegisterBroker", "broker": "b1", "address": "http://10.0.0.1:1"},
                                 None, "test")
        assert out["ok"], out
        acked = _version(follower)
        assert _version(leader) < acked, "the window the wait closes: a follower answered before the leader applied"
        waiting = asyncio.ensure_future(raft.applied_commit(WAIT_S))
        await asyncio.sleep(0.3)
        assert not waiting.done(), "the wait returned while the leader's image lacked an acknowledged write"
        gate.set()
        assert await waiting
        assert _version(leader) >= acked
    finally:
        gate.set()
        for n in nodes:
            n.stop()
