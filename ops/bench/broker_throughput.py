"""Produce and consume throughput of one broker: 1 KB messages in batches of 100, fsync per batch (the default).

    python -m ops.bench.broker_throughput [--seconds 10] [--queues 8] [--concurrency 16]

Starts its own cluster (3 meta nodes, 1 broker) in a temp dir, produces for a fixed time over several queues, then
consumes everything back with pulls of 100; prints one JSON object (messages/s each way, pull latency p50/p99).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time

import aiohttp

from ops import devcluster
from ops.bench.common import free_base_port

BATCH = 100


def percentiles(ms: list[float]) -> dict[str, float | None]:
    v = sorted(ms)
    pick = lambda p: round(v[min(len(v) - 1, int(p * len(v)))], 2) if v else None  # noqa: E731
    return {"p50": pick(0.5), "p99": pick(0.99), "max": round(v[-1], 2) if v else None}
BODY = "x" * 1000


async def produce(session, url, token, topic, queue, deadline, lat) -> int:
    payload = json.dumps({"messages": [{"body": BODY} for _ in range(BATCH)]}).encode()
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    sent = 0
    while time.monotonic() < deadline:
        t = time.perf_counter()
        async with session.post(f"{url}/v1/messages/{topic}/{queue}", data=payload, headers=headers) as r:
            await r.read()
            if r.status != 200:
                await asyncio.sleep(0.01)
                continue
        lat.append((time.perf_counter() - t) * 1000)
        sent += BATCH
    return sent


async def consume(session, url, token, topic, queue, end, lat) -> int:
    headers = {"Authorization": f"Bearer {token}"}
    offset, got = 0, 0
    while offset < end:
        t = time.perf_counter()
        async with session.get(f"{url}/v1/messages/{topic}/{queue}?offset={offset}&max={BATCH}", headers=headers) as r:
            body = await r.json()
        lat.append((time.perf_counter() - t) * 1000)
        got += len(body["messages"])
        offset = body["next_offset"]
    return got


async def run(args) -> dict:
    with tempfile.TemporaryDirectory(prefix="stator-bench-") as tmp:
        cluster = devcluster.up(os.path.join(tmp, "c"), 3, 1, free_base_port())
        try:
            meta, broker = cluster["meta"][0]["url"], cluster["brokers"][0]["url"]
            admin, client = cluster["admin_token"], cluster["client_token"]
            conn = aiohttp.TCPConnector(limit=args.concurrency * 2)
            async with aiohttp.ClientSession(connector=conn) as s:
                h = {"Authorization": f"Bearer {admin}"}
                async with s.post(f"{meta}/v1/topics", json={"topic": "bench", "queues": args.queues}, headers=h) as r:
                    assert r.status == 201, await r.text()
                await asyncio.sleep(1.0)  # the broker learns the route and its budgets
                warm_lat: list[float] = []
                await asyncio.gather(*(produce(s, broker, client, "bench", q, time.monotonic() + 1, warm_lat)
                                       for q in range(args.queues)))
                lat: list[float] = []
                t0 = time.monotonic()
                counts = await asyncio.gather(*(produce(s, broker, client, "bench", i % args.queues,
                                                        t0 + args.seconds, lat) for i in range(args.concurrency)))
                produce_s = time.monotonic() - t0
                h = {"Authorization": f"Bearer {client}"}
                async with s.get(f"{broker}/v1/queues/bench", headers=h) as r:
                    ends = {q["queue"]: q["max_offset"] for q in (await r.json())["queues"]}
                pull_lat: list[float] = []
                t1 = time.monotonic()
                got = await asyncio.gather(*(consume(s, broker, client, "bench", q, ends[q], pull_lat)
                                             for q in range(args.queues)))
                consume_s = time.monotonic() - t1
            produced = sum(counts)
            return {
                "benchmark": "broker_throughput", "message_bytes": len(BODY), "batch": BATCH, "flush": "fsync",
                "queues": args.queues, "concurrency": args.concurrency,
                "produce": {"messages": produced, "seconds": round(produce_s, 2),
                            "messages_per_s": round(produced / produce_s),
                            "batch_latency_ms": percentiles(lat)},
                "consume": {"messages": sum(got), "seconds": round(consume_s, 2),
                            "messages_per_s": round(sum(got) / consume_s),
                            "pull_latency_ms": percentiles(pull_lat)},
                "loadavg": open("/proc/loadavg").read().split()[:3],
            }
        finally:
            devcluster.down(os.path.join(tmp, "c"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--queues", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=16)
    args = ap.parse_args()
    print(json.dumps(asyncio.run(run(args))))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
