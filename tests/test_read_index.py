"""Linearizable reads by read index (meta/raft/read_index.py, issue 38) on three real meta processes.

- They append nothing to the log: hundreds of them on an idle cluster, through every node, leave every node's commit
  index where it was (each used to append a barrier entry).
- They never return state older than an acknowledged write: a writer acknowledges writes through every node while
  readers on every node read linearizably; each read shows at least the newest write acknowledged before it was sent.
"""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest

from tests.support.meta_http import BrokerSim, cluster_status, ok

pytestmark = pytest.mark.slow

READS = 300
RACE_S = 6.0          # writer and readers side by side
READERS_PER_NODE = 2


async def commit_indexes(c) -> dict[str, int]:
    return {u: (await cluster_status(c, u))["commit_index"] for u in c.meta_urls}


async def test_linearizable_reads_append_nothing_to_the_log(meta_cluster):
    c = meta_cluster
    before = await commit_indexes(c)
    assert len(set(before.values())) == 1, f"an idle cluster's nodes disagree on the commit index: {before}"
    nodes = itertools.cycle(c.meta_urls)
    for _ in range(READS):
        s, body, _ = await c.call("GET", f"{next(nodes)}/v1/cluster?consistency=linearizable", "client")
        assert s == 200, (s, body)
    after = await commit_indexes(c)
    assert after == before, f"{READS} linearizable reads moved the commit index: {before} -> {after}"


async def test_a_linearizable_read_never_misses_an_acknowledged_write(meta_cluster):
    c = meta_cluster
    sim = BrokerSim(c)
    try:
        await sim.register("b1")
        await ok(c, "POST", "/v1/topics", json={"topic": "lin", "queues": 1, "brokers": ["b1"]}, expect=(201,))
        acked: list[tuple[float, int, int]] = []   # (monotonic time of the answer, version, value), in order
        stop = time.monotonic() + RACE_S
        reads = {"count": 0, "writes_seen_at_least": 0}

        async def writer() -> None:
            for n in itertools.count(1):
                if time.monotonic() > stop:
                    return
                url = c.meta_urls[n % len(c.meta_urls)]
                s, b, _ = await c.call("PUT", f"{url}/v1/topics/lin/config", json={"n": str(n)})
                assert s == 200, (s, b)
                acked.append((time.monotonic(), b["version"], n))

        async def reader(url: str) -> None:
            while time.monotonic() < stop:
                sent = time.monotonic()
                floor = next(((v, n) for t, v, n in reversed(acked) if t < sent), (0, 0))
                s, d, _ = await c.call("GET", f"{url}/v1/topics/lin?consistency=linearizable", "client")
                assert s == 200, (url, s, d)
                assert d["version"] >= floor[0], f"{url} read version {d['version']} after {floor[0]} was acknowledged"
                assert int(d["config"].get("n", "0")) >= floor[1], (url, d, floor)
                reads["count"] += 1
                reads["writes_seen_at_least"] += floor[1] > 0

        await asyncio.gather(writer(), *(reader(u) for u in c.meta_urls for _ in range(READERS_PER_NODE)))
        assert len(acked) > 20 and reads["writes_seen_at_least"] > 50, (len(acked), reads)
    finally:
        await sim.close()
