"""A lost disk loses nothing: a meta node whose data directory was wiped rejoins as a learner (meta/raft/membership.py).

The scenario of issue 24, on real processes: three meta nodes; follower A is down while 8 topics are created and
acknowledged through the leader L and the other follower B; B's disk is then wiped and L killed; A and B start
again. Before disk identities, the empty B voted for A, A led without the 8 creates and took writes on top of them,
and L diverged when it came back. Now B is a learner: no leader can be elected from A and B alone, so no read and
no write is served without the creates; once L is back, B catches up from L, is promoted through the log, and
all three nodes hold the same image and the same voters.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time

import pytest

from tests.support import cluster as cluster_mod
from tests.support.meta_http import NET_ERRORS, BrokerSim, cluster_status, node_urls, ok, wait_until

pytestmark = pytest.mark.slow

TOPICS = [f"acked{i}" for i in range(8)]
WATCH_S = 8.0          # how long A and the wiped B are left alone, probed all along
ANSWER_S = 15.0        # a node without a leader answers 503 once its read barrier or proposal times out
CATCH_UP_S = 60.0      # generous: a loaded 2-core machine restarts a node, elects, installs and promotes


async def _probe(c, url: str, i: int, seen: list[tuple[str, int, object]]) -> None:
    """A linearizable read and a write on ``url``; every answer is kept to be judged after."""
    for kind, method, path, body in (("read", "GET", "/v1/topics?consistency=linearizable", None),
                                     ("write", "POST", "/v1/topics", {"topic": f"probe{i}", "queues": 1,
                                                                      "brokers": ["b1"]})):
        try:
            s, b, _ = await c.call(method, url + path, "admin", json=body, timeout_s=ANSWER_S)
        except NET_ERRORS as e:
            s, b = 0, repr(e)
        seen.append((kind, s, b))


async def test_a_wiped_follower_never_votes_the_acknowledged_creates_away(tmp_path):
    async with cluster_mod.running(str(tmp_path), 3, 0, meta={"session_timeout_ms": 120_000}) as c:
        sim = BrokerSim(c)
        try:
            await sim.register("b1", heartbeat=False)
            leader, lurl, followers = await node_urls(c)
            a_url, b_url = followers
            a, b = (next(m["node"] for m in c.info["meta"] if m["url"] == u) for u in (a_url, b_url))
            before = await cluster_status(c, b_url)
            assert before["voter"] is True and before["disk"], before
            recorded = {m["node"]: m["disk"] for m in before["members"]}
            assert all(recorded.values()), f"the bootstrap recorded every voter's disk: {before}"

            await asyncio.to_thread(c.kill9, a)
            for t in TOPICS:   # acknowledged by the leader and B
                await ok(c, "POST", "/v1/topics", json={"topic": t, "queues": 1, "brokers": ["b1"]}, url=lurl,
                         expect=(201,))
            await asyncio.to_thread(c.kill9, b)
            shutil.rmtree(os.path.join(c.dir, b, "data"))
            await asyncio.to_thread(c.kill9, leader)
            for name in (a, b):
                await asyncio.to_thread(devcluster_start, c, name)

            async def answering():
                return all([await cluster_status(c, u) for u in (a_url, b_url)])
            await wait_until(answering, CATCH_UP_S, f"{a} and {b} to answer")
            # A and the wiped B alone: every answer is a refusal or holds all 8 creates; no write is accepted.
            seen: list[tuple[str, int, object]] = []

            async def probing(url: str, first: int) -> None:
                deadline = time.monotonic() + WATCH_S
                i = first
                while time.monotonic() < deadline:
                    await _probe(c, url, i, seen)
                    i += 2
                    await asyncio.sleep(0.1)
            await asyncio.gather(probing(a_url, 0), probing(b_url, 1))
            reads = [body for kind, s, body in seen if kind == "read" and s == 200]
            lacking = [body for body in reads if not set(TOPICS) <= {t["topic"] for t in body["topics"]}]
            assert lacking == [], f"a linearizable read without the acknowledged creates: {lacking[:2]}"
            accepted = [(s, body) for kind, s, body in seen if kind == "write" and s < 300]
            assert accepted == [], f"a write accepted without the old leader: {accepted[:2]}"
            refusals = [(kind, s, body) for kind, s, body in seen if s >= 500]
            assert refusals, f"the nodes answered nothing in {WATCH_S} s: {seen[:4]}"
            wiped = await cluster_status(c, b_url)
            assert wiped["voter"] is False and wiped["disk"] != recorded[b], wiped

            # The old leader returns: B catches up as a learner and is promoted with its new disk.
            await asyncio.to_thread(devcluster_start, c, leader)

            async def promoted():
                statuses = [await cluster_status(c, u) for u in c.meta_urls]
                disks = [{m["node"]: m["disk"] for m in s["members"]} for s in statuses]
                if all(s["voter"] for s in statuses) and all(d[b] == wiped["disk"] for d in disks):
                    return statuses
                return None
            await wait_until(promoted, CATCH_UP_S, f"{b} promoted with its new disk on every node")
            for t in TOPICS:
                await ok(c, "GET", f"/v1/topics/{t}?consistency=linearizable", role="client", url=b_url)

            async def same_image():
                digests = [await ok(c, "GET", "/v1/admin/image-digest", url=u) for u in c.meta_urls]
                return digests if len({(d["version"], d["sha256"]) for d in digests}) == 1 else None
            await wait_until(same_image, CATCH_UP_S, "the same image on all three nodes")
            # The cluster takes writes again, B's acknowledgement counting toward them.
            await ok(c, "POST", "/v1/topics", json={"topic": "after", "queues": 1, "brokers": ["b1"]},
                     expect=(201,))
        finally:
            await sim.close()


def devcluster_start(c, name: str) -> None:
    """Start a meta node without waiting for it to be ready: with no majority it cannot be."""
    from ops import devcluster
    devcluster.start(c.dir, name, wait=False)
    c.reload()
