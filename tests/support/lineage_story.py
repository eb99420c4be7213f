"""A real cluster's history for the lineage tests, made once per test module: three meta nodes and three brokers;
a topic produced to and remapped twice (queue routes recorded after each step), a topic deleted and created again
with the same name, and an exclusive group whose members join, hand a queue over, leave and let a lease expire.
The cluster is stopped before any Spark test runs; what the tests compare against was read from its HTTP API.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from client import AdminClient, Producer, Sealing
from meta.export import exporter
from tests.support import cluster as cluster_mod
from tests.support.meta_http import ok

TOPIC, AGAIN, GROUP = "orders", "again", "billing"
LEASE_MS = 2000
STEP_TIMEOUT_S = 30.0


@dataclass
class Story:
    out: str                                             # the export
    chains: dict[int, list[dict[str, Any]]]              # TOPIC's queue -> its segments, from GET /v1/topics/T
    written: dict[int, int]                              # TOPIC's queue -> messages produced (logic offsets 0..n-1)
    routes: list[tuple[str, int, dict[int, tuple]]] = field(default_factory=list)  # (topic, at ms, {q: (b, pq, gen)})
    moves: list[dict[str, Any]] = field(default_factory=list)    # remap answers' moved entries, with topic and version
    events: list[dict[str, Any]] = field(default_factory=list)   # the whole history, from GET /v1/history
    gaps: list[tuple[str, int]] = field(default_factory=list)    # (topic, ms) when the topic did not exist


def make(base: str) -> Story:
    return asyncio.run(_make(base))


async def _make(base: str) -> Story:
    async with cluster_mod.running(base, 3, 3, meta={"session_timeout_ms": 3000, "heartbeat_interval_ms": 500}) as c, \
            AdminClient(c.meta_urls, c.token("admin")) as admin:
        story = Story(out=f"{base}/export", chains={}, written={0: 0, 1: 0})
        route_versions: list[tuple[str, dict]] = []
        await admin.create_topic(TOPIC, queues=2, brokers=["b1", "b2"])
        await _produce_and_remap(c, admin, story, route_versions)
        topic = await admin.describe_topic(TOPIC)
        story.chains = {lq["queue"]: lq["segments"] for lq in topic["logic_queues"]}
        await _recreate(c, admin, story, route_versions)
        await _group_story(c, admin)
        story.events = [e async for e in admin.iter_history()]
        ts_of = {e["version"]: e["ts"] for e in story.events}
        for name, r in route_versions:
            story.routes.append((name, ts_of[r["version"]],
                                 {q["queue"]: (q["broker"], q["physical_queue"], q["gen"]) for q in r["queues"]}))
        story.gaps = [(name, ts_of[v]) for name, v in story.gaps]
        await exporter.export(c.meta_urls, c.token("client"), story.out)
    return story


async def _produce_and_remap(c, admin: AdminClient, story: Story, route_versions: list) -> None:
    """Three steps of sends to both queues, with a remap of both before the second and the third."""
    async with Producer(c.meta_urls, c.token("client"), TOPIC) as producer:
        for step, targets in enumerate((None, ["b3"], ["b1", "b2"])):
            if targets is not None:
                answer = await _remap(admin, targets)
                story.moves += [{"topic": TOPIC, "version": answer["version"], **m} for m in answer["moved"]]
            for q in (0, 1):
                sent = await producer.send_batch([f"s{step}-{i}" for i in range(3 + step)], queue=q)
                assert sent.offsets == list(range(story.written[q], story.written[q] + 3 + step))
                story.written[q] += 3 + step
            route_versions.append((TOPIC, await ok(c, "GET", f"/v1/routes/{TOPIC}?consistency=linearizable", "client")))


async def _remap(admin: AdminClient, targets: list[str]) -> dict[str, Any]:
    deadline = time.monotonic() + STEP_TIMEOUT_S
    while True:
        try:
            return await admin.remap(TOPIC, targets)
        except Sealing:   # the previous move of a queue is still completing
            assert time.monotonic() < deadline, "the topic stayed SEALING"
            await asyncio.sleep(0.1)


async def _recreate(c, admin: AdminClient, story: Story, route_versions: list) -> None:
    await admin.create_topic(AGAIN, queues=1, brokers=["b1"])
    route_versions.append((AGAIN, await ok(c, "GET", f"/v1/routes/{AGAIN}?consistency=linearizable", "client")))
    await asyncio.sleep(0.05)
    deleted = await admin.delete_topic(AGAIN)
    await asyncio.sleep(0.05)
    story.gaps.append((AGAIN, deleted["version"]))      # a version for now: made a time once the history is read
    await admin.create_topic(AGAIN, queues=1, brokers=["b2"])
    route_versions.append((AGAIN, await ok(c, "GET", f"/v1/routes/{AGAIN}?consistency=linearizable", "client")))


async def _group_story(c, admin: AdminClient) -> None:
    await admin.set_group_config(GROUP, {"lease_ms": LEASE_MS, "heartbeat_interval_ms": LEASE_MS // 4})

    async def beat(member: str, released: list | None = None) -> dict:
        body = {"member": member, "topics": [TOPIC], "mode": "exclusive"}
        if released:
            body["released"] = released
        return await ok(c, "POST", f"/v1/groups/{GROUP}/heartbeat", "client", body)

    await beat("m1")                                      # m1 is granted both queues
    await beat("m2")                                      # one queue's target moves to m2 (LockTargetChanged)
    revoking = (await beat("m1"))["revoking"]
    assert len(revoking) == 1, revoking
    await beat("m1", released=[{k: r[k] for k in ("topic", "queue", "token")} for r in revoking])  # granted to m2
    await beat("m2")
    await ok(c, "POST", f"/v1/groups/{GROUP}/leave", "client", {"member": "m1"})   # its other queue: left, to m2
    await beat("m3")                                      # a target moves to m3; m2 now stops heartbeating
    deadline = time.monotonic() + STEP_TIMEOUT_S
    while "m2" in {m["member"] for m in (await admin.describe_group(GROUP))["members"]}:
        assert time.monotonic() < deadline, "m2's lease never expired"
        await beat("m3")
        await asyncio.sleep(LEASE_MS / 8000)
    await ok(c, "POST", f"/v1/groups/{GROUP}/leave", "client", {"member": "m3"})
