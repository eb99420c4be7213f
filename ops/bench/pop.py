"""Pop consumption on one real broker (issue 9): pop + ack throughput, and redelivery lateness after the invisible time.

    python -m ops.bench.pop [--messages 200000] [--queues 8] [--consumers 8] [--max 64] [--lateness-messages 2000]

Starts its own cluster (3 meta nodes, 1 broker) in a temp dir. Throughput: the topic is filled first (batches of 500
messages of 100 bytes), then ``--consumers`` concurrent consumers each pop (``max`` per pop, long-poll 1 s) and ack
every message they got with one batch ack, until everything was acked once; messages/s = acked / elapsed (target:
20,000); each consumer acks in the background, at most 4 batch acks outstanding (as client/pop.py does).
Lateness: a second group pops ``--lateness-messages`` messages and acks none; the n-th first pop gets
1 s + n * 20 ms, so redeliveries come due spread out, at a rate the consumers keep up with; the consumers long-poll,
and each redelivery's lateness is its arrival minus (the send time of the pop that delivered it first + its
invisible time), an upper bound of the broker's own lateness (target: p99 under 200 ms). Prints one JSON object.
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
from ops.bench.common import free_base_port, loadavg, say

BODY = "x" * 100
FILL_BATCH = 500
INVISIBLE_MS = 1000
# Each first pop of the lateness run gets this much more invisible time than the one before: the redeliveries then
# come due spread out (about 3,000/s with max 64), a rate the consumers keep up with, so the figure is the revive's
# lateness, not the time to drain a backlog that all came due at once.
LATENESS_SPREAD_MS = 20
PHASE_S_MAX = 300.0           # a phase that has not finished by then reports what it has, "complete": false
ACKS_OUTSTANDING_MAX = 4      # per consumer: batch acks sent while it pops on


def percentiles(ms: list[float]) -> dict[str, float | None]:
    v = sorted(ms)
    pick = lambda p: round(v[min(len(v) - 1, int(p * len(v)))], 2) if v else None  # noqa: E731
    return {"p50": pick(0.5), "p90": pick(0.9), "p99": pick(0.99), "max": round(v[-1], 2) if v else None}


async def post(s: aiohttp.ClientSession, url: str, token: str, body: dict) -> dict:
    async with s.post(url, data=json.dumps(body).encode(),
                      headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"}) as r:
        data = await r.json(content_type=None)
        if r.status != 200:
            raise RuntimeError(f"{url}: {r.status} {data}")
        return data


async def fill(s, broker: str, token: str, topic: str, queues: int, total: int) -> None:
    payload = {"messages": [{"body": BODY} for _ in range(FILL_BATCH)]}

    async def one(q: int) -> None:
        for _ in range(total // queues // FILL_BATCH):
            await post(s, f"{broker}/v1/messages/{topic}/{q}", token, payload)
    await asyncio.gather(*(one(q) for q in range(queues)))


async def throughput(s, broker: str, token: str, args, total: int) -> dict:
    acked = 0
    pops: list[float] = []
    acks: list[float] = []
    seen: set[tuple[int, int]] = set()
    duplicates = 0

    async def ack_batch(got: list[dict], gate: asyncio.Semaphore) -> None:
        nonlocal acked
        try:
            t = time.perf_counter()
            results = (await post(s, f"{broker}/v1/ack", token,
                                  {"group": "tp", "handles": [m["handle"] for m in got]}))["results"]
            acks.append((time.perf_counter() - t) * 1000)
            acked += sum(1 for r in results if r["ok"])
        finally:
            gate.release()

    async def consumer() -> None:
        """Pops, and acks each batch in the background (at most ACKS_OUTSTANDING_MAX at once), as PopConsumer does."""
        nonlocal duplicates
        gate = asyncio.Semaphore(ACKS_OUTSTANDING_MAX)
        acking: list[asyncio.Task] = []
        while len(seen) < total and time.monotonic() < deadline:
            t = time.perf_counter()
            got = (await post(s, f"{broker}/v1/pop/bench", token,
                              {"group": "tp", "max": args.max, "wait_ms": 1000, "invisible_ms": 60_000}))["messages"]
            pops.append((time.perf_counter() - t) * 1000)
            if not got:
                continue
            for m in got:
                k = (m["queue"], m["offset"])
                duplicates += k in seen
                seen.add(k)
            await gate.acquire()
            acking.append(asyncio.create_task(ack_batch(got, gate)))
        await asyncio.gather(*acking)

    t0 = time.monotonic()
    deadline = t0 + PHASE_S_MAX
    await asyncio.gather(*(consumer() for _ in range(args.consumers)))
    elapsed = time.monotonic() - t0
    return {"messages": acked, "seconds": round(elapsed, 2), "messages_per_s": round(acked / elapsed),
            "target_messages_per_s": 20_000, "complete": acked >= total, "duplicates": duplicates,
            "pop_latency_ms": percentiles(pops),
            "ack_latency_ms": percentiles(acks), "loadavg": loadavg()}


async def lateness(s, broker: str, token: str, args) -> dict:
    first_sent: dict[tuple[int, int], float] = {}
    late: list[float] = []
    want = args.lateness_messages
    batch = 0
    while len(first_sent) < want and batch < want:
        t = time.time()
        invisible_ms = INVISIBLE_MS + batch * LATENESS_SPREAD_MS
        got = (await post(s, f"{broker}/v1/pop/late", token,
                          {"group": "late", "max": min(args.max, want - len(first_sent)),
                           "invisible_ms": invisible_ms}))["messages"]
        for m in got:
            first_sent[(m["queue"], m["offset"])] = t + invisible_ms / 1000   # when it should come back
        batch += 1

    acking: list[asyncio.Task] = []

    deadline = time.monotonic() + PHASE_S_MAX

    async def consumer() -> None:
        while len(late) < want and time.monotonic() < deadline:
            got = (await post(s, f"{broker}/v1/pop/late", token,
                              {"group": "late", "max": args.max, "wait_ms": 2000, "invisible_ms": 60_000}))["messages"]
            now = time.time()
            for m in got:
                late.append((now - first_sent[(m["queue"], m["offset"])]) * 1000)
            if got:
                acking.append(asyncio.create_task(post(s, f"{broker}/v1/ack", token,
                                                       {"group": "late", "handles": [m["handle"] for m in got]})))
    await asyncio.gather(*(consumer() for _ in range(args.consumers)))
    await asyncio.gather(*acking)
    early = sum(1 for x in late if x < 0)
    return {"messages": len(late), "complete": len(late) >= want, "invisible_ms": INVISIBLE_MS,
            "spread_ms_per_pop": LATENESS_SPREAD_MS,
            "lateness_ms": percentiles(late),
            "target_p99_ms": 200, "early": early, "loadavg": loadavg()}


async def run(args) -> dict:
    with tempfile.TemporaryDirectory(prefix="stator-bench-") as tmp:
        d = os.path.join(tmp, "c")
        cluster = devcluster.up(d, 3, 1, free_base_port())
        try:
            meta, broker = cluster["meta"][0]["url"], cluster["brokers"][0]["url"]
            admin, client = cluster["admin_token"], cluster["client_token"]
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as s:
                for topic in ("bench", "late"):
                    async with s.post(f"{meta}/v1/topics", json={"topic": topic, "queues": args.queues},
                                      headers={"Authorization": f"Bearer {admin}"}) as r:
                        assert r.status == 201, await r.text()
                await asyncio.sleep(1.0)  # the broker learns the routes and their budgets
                total = args.messages // args.queues // FILL_BATCH * args.queues * FILL_BATCH
                say(f"filling {total} messages")
                await fill(s, broker, client, "bench", args.queues, total)
                args.lateness_messages = max(1, args.lateness_messages // args.queues // FILL_BATCH) * args.queues \
                    * FILL_BATCH
                await fill(s, broker, client, "late", args.queues, args.lateness_messages)
                say("pop + ack throughput")
                tp = await throughput(s, broker, client, args, total)
                say(f"throughput: {tp['messages_per_s']} messages/s; redelivery lateness")
                lt = await lateness(s, broker, client, args)
            return {"benchmark": "pop", "queues": args.queues, "consumers": args.consumers, "max": args.max,
                    "message_bytes": len(BODY), "throughput": tp, "redelivery": lt}
        finally:
            devcluster.down(d)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--queues", type=int, default=8)
    ap.add_argument("--consumers", type=int, default=8)
    ap.add_argument("--max", type=int, default=64)
    ap.add_argument("--lateness-messages", type=int, default=2_000)
    args = ap.parse_args()
    print(json.dumps(asyncio.run(run(args)), indent=2))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
