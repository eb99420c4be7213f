"""Drain one broker of four under continuous sends (issue 37): every head copy it holds moves to other brokers while
a producer per queue keeps sending; then every acknowledged message is read back.

    python -m ops.bench.drain [--queues 16] [--replicas 2]

Starts 3 meta nodes and 4 brokers, creates a topic over them, runs one producer per queue (batches of 10 small
messages, following the route: on a refusal it asks the route again until the queue is writable), starts
``POST /v1/brokers/b1/drain`` and waits until b1 holds no copy of anything (``GET /v1/brokers/b1``: ``holding`` and
``sealed_copies`` 0: heads moved, older segments copied elsewhere). Reports how long the heads and the whole drain
took, the longest time any queue went without an acknowledged send while it ran (the issue's "sends never refused
for longer than 1 s"), the refusals by code, the acknowledged messages and how many of them were not read back once
b1 was killed and its data directory removed (drained, it can go).
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import tempfile
import time

import aiohttp

from ops import devcluster
from ops.bench.common import free_base_port

TOPIC = "drain"
BATCH = 10
DRAIN_TIMEOUT_S = 120.0
POLL_S = 0.05
READ_PAGE = 1000


async def run(args) -> dict:
    with tempfile.TemporaryDirectory(prefix="stator-bench-") as tmp:
        cluster = devcluster.up(os.path.join(tmp, "c"), 3, 4, free_base_port())
        try:
            return await _measure(cluster, args, os.path.join(tmp, "c"))
        finally:
            devcluster.down(os.path.join(tmp, "c"))


async def _measure(cluster: dict, args, cluster_dir: str) -> dict:
    meta = cluster["meta"][0]["url"]
    admin = {"Authorization": f"Bearer {cluster['admin_token']}"}
    client = {"Authorization": f"Bearer {cluster['client_token']}"}
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(timeout=timeout) as s:
        async with s.post(f"{meta}/v1/topics", json={"topic": TOPIC, "queues": args.queues, "replicas": args.replicas},
                          headers=admin) as r:
            assert r.status == 201, await r.text()
        stop = asyncio.Event()
        acks: dict[int, list[tuple[float, list[int]]]] = {q: [] for q in range(args.queues)}
        sent: dict[int, dict[int, str]] = {q: {} for q in range(args.queues)}
        refusals: dict[str, int] = {}

        async def address(q: int) -> str:
            while True:
                async with s.get(f"{meta}/v1/routes/{TOPIC}", headers=client) as r:
                    entry = (await r.json())["queues"][q]
                if entry["writable"]:
                    return entry["address"]
                await asyncio.sleep(POLL_S)

        async def producer(q: int) -> None:
            addr, n = await address(q), 0
            while not stop.is_set():
                bodies = [f"{q}.{n}.{i}" for i in range(BATCH)]
                try:
                    async with s.post(f"{addr}/v1/messages/{TOPIC}/{q}", json={"messages": [{"body": b} for b in bodies]},
                                      headers=client) as r:
                        body = await r.json()
                    if r.status == 200:
                        acks[q].append((time.monotonic(), body["offsets"]))
                        sent[q].update(zip(body["offsets"], bodies))
                        n += 1
                        continue
                    code = body["error"]["code"]
                except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                    code = type(e).__name__
                refusals[code] = refusals.get(code, 0) + 1
                addr = await address(q)

        tasks = [asyncio.create_task(producer(q)) for q in range(args.queues)]
        await asyncio.sleep(1.0)
        before = await _broker(s, meta, client, "b1")
        started = time.monotonic()
        async with s.post(f"{meta}/v1/brokers/b1/drain", json={"draining": True}, headers=admin) as r:
            assert r.status == 200, await r.text()
        heads_moved = None
        while True:
            now = await _broker(s, meta, client, "b1")
            if heads_moved is None and not now["holding"]:
                heads_moved = time.monotonic()
            if not now["holding"] and not now["sealed_copies"]:
                break
            assert time.monotonic() - started < DRAIN_TIMEOUT_S, f"the drain did not end: {now}"
            await asyncio.sleep(POLL_S)
        drained = time.monotonic()
        await asyncio.sleep(1.0)
        stop.set()
        await asyncio.gather(*tasks)
        after = await _broker(s, meta, client, "b1")
        # Drained means it can go: b1 is killed and its disk removed before everything is read back
        devcluster.stop_member(cluster_dir, "b1", signal.SIGKILL)
        shutil.rmtree(os.path.join(cluster_dir, "b1", "data"))
        async with s.get(f"{meta}/v1/routes/{TOPIC}", headers=client) as r:
            route = await r.json()
        lost = 0
        for q, entry in enumerate(route["queues"]):
            got = await _read_all(s, entry["address"], q, client)
            lost += sum(1 for o, b in sent[q].items() if got.get(o) != b)
        gaps = [(t1 - t0) * 1000 for q in acks for (t0, _), (t1, _) in zip(acks[q], acks[q][1:])
                if t1 >= started and t0 <= drained]
        return {"benchmark": "drain", "queues": args.queues, "replicas": args.replicas,
                "b1_head_copies_before": before["holding"], "b1_older_segments_before": before["sealed_copies"],
                "heads_moved_s": round(heads_moved - started, 2), "drain_s": round(drained - started, 2),
                "longest_without_ack_ms": round(max(gaps), 1) if gaps else None,
                "refusals": refusals, "acknowledged_messages": sum(len(v) for v in sent.values()),
                "acknowledged_lost": lost, "b1_head_copies_after": after["holding"],
                "b1_older_segments_after": after["sealed_copies"],
                "heads_copied_on_b1": sum(1 for e in route["queues"] if "b1" in e["replicas"]),
                "loadavg": open("/proc/loadavg").read().split()[:3]}


async def _broker(s: aiohttp.ClientSession, meta: str, client: dict, name: str) -> dict:
    async with s.get(f"{meta}/v1/brokers/{name}", headers=client) as r:
        return await r.json()


async def _read_all(s: aiohttp.ClientSession, address: str, q: int, client: dict) -> dict[int, str]:
    got: dict[int, str] = {}
    offset = 0
    while True:
        async with s.get(f"{address}/v1/messages/{TOPIC}/{q}", params={"offset": offset, "max": READ_PAGE},
                         headers=client) as r:
            page = await r.json()
        for m in page["messages"]:
            got[m["offset"]] = m["body"]
        if page["next_offset"] <= offset or not page["messages"]:
            return got
        offset = page["next_offset"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--queues", type=int, default=16)
    ap.add_argument("--replicas", type=int, default=2)
    args = ap.parse_args()
    print(json.dumps(asyncio.run(run(args))))


if __name__ == "__main__":
    main()
