"""Produce and consume throughput of a broker (or of several on one machine): 1 KB x 100 per batch, each on disk
before its answer.

    python -m ops.bench.broker_throughput [--seconds 10] [--queues 8] [--concurrency 16] [--generators 2] [--brokers 1]
                                          [--wire binary|json] [--pull-max 100] [--sync-scope filesystem|file]

Starts its own cluster (3 meta nodes, ``--brokers`` brokers) in a temp dir, produces for a fixed time over several
queues, then consumes everything back with pulls of 100; prints one JSON object: messages/s each way, batch and pull
latency, and the disk's own append+fdatasync rate for the same batches measured in the same run on the same file
system (``disk_ceiling``), with the ratio to it.

Where the limit is: the load runs in ``--generators`` processes of their own, and the CPU seconds of the broker and
of the generators over each phase are reported as a share of one core. A broker near 1.0 while the generators are
well below is the broker's limit (one event loop, one core); generators near 1.0 are the load's. ``--brokers N``
spreads the topic's queues over N broker processes on the same machine and file system (the CPU figure is then
their sum): whether more broker processes lift the rate, or the machine's cores are the limit.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor

import aiohttp

from broker.config import SYNC_SCOPE_FILESYSTEM, SYNC_SCOPES
from ops import devcluster
from wire import batch
from ops.bench.bench_storage import disk_ceiling
from ops.bench.common import cpu_seconds, free_base_port, metric_sums

BATCH = 100
BODY = "x" * 1000
WIRE = "binary"   # the form of sends and pulls: "binary" (wire/batch.py, the client's default) or "json"
PULL_MAX = BATCH  # messages a consumer's pull asks for (the API allows up to 1,000; a Kafka fetch takes up to 500)
START_DELAY_S = 1.0          # generators start together, this long after they are handed their work
DISK_CEILING_SECONDS = 2.0


def percentiles(ms: list[float]) -> dict[str, float | None]:
    v = sorted(ms)
    pick = lambda p: round(v[min(len(v) - 1, int(p * len(v)))], 2) if v else None  # noqa: E731
    return {"p50": pick(0.5), "p99": pick(0.99), "max": round(v[-1], 2) if v else None}


async def produce(session, url, token, topic, queue, deadline, lat) -> int:
    """``url``: the broker holding the queue's head."""
    if WIRE == "binary":
        payload = batch.encode([batch.Message(None, None, BODY.encode(), True)] * BATCH)
        content_type = batch.CONTENT_TYPE
    else:
        payload = json.dumps({"messages": [{"body": BODY} for _ in range(BATCH)]}).encode()
        content_type = "application/json"
    headers = {"Authorization": f"Bearer {token}", "Content-Type": content_type}
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
    if WIRE == "binary":
        headers["Accept"] = batch.CONTENT_TYPE
    offset, got = 0, 0
    while offset < end:
        t = time.perf_counter()
        async with session.get(f"{url}/v1/messages/{topic}/{queue}?offset={offset}&max={PULL_MAX}",
                               headers=headers) as r:
            if WIRE == "binary":
                # The count from the header, not a decode of every record: the figure is the broker's, and a
                # generator decoding 300,000 messages a second would measure itself.
                raw = await r.read()
                got += batch.HEADER.unpack_from(raw)[3]
                offset = json.loads(r.headers["X-Pull"])["next_offset"]
            else:
                body = await r.json()
                got += len(body["messages"])
                offset = body["next_offset"]
        lat.append((time.perf_counter() - t) * 1000)
    return got


def generate(kind: str, token: str, topic: str, work: list, start_at: float, seconds: float) -> dict:
    """One generator process: ``work`` is (broker url, queue) pairs (produce: one connection each, for ``seconds``
    from ``start_at`` wall time) or (broker url, queue, end) (consume: until each queue's end). Returns its counts,
    latencies and own CPU seconds."""
    async def go() -> tuple[int, list[float]]:
        lat: list[float] = []
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=len(work) * 2 or 1)) as s:
            await asyncio.sleep(max(0.0, start_at - time.time()))
            if kind == "produce":
                deadline = time.monotonic() + seconds
                counts = await asyncio.gather(*(produce(s, url, token, topic, q, deadline, lat) for url, q in work))
            else:
                counts = await asyncio.gather(*(consume(s, url, token, topic, q, end, lat)
                                                for url, q, end in work))
        return sum(counts), lat
    cpu0 = time.process_time()
    count, lat = asyncio.run(go())
    return {"count": count, "lat": lat, "cpu_s": time.process_time() - cpu0}


_STORAGE_SAMPLES = {f"stator_broker_{k}": k for k in (
    "append_seconds_count", "append_seconds_sum", "fsync_seconds_count", "fsync_seconds_sum",
    "copies_wait_seconds_count", "copies_wait_seconds_sum",
    "copy_acknowledge_seconds_count", "copy_acknowledge_seconds_sum")}


def _append_figures(urls: list[str]) -> dict[str, float]:
    """The brokers' append and sync histograms' counts and sums from their /metrics (public), summed."""
    import urllib.request
    out = dict.fromkeys(_STORAGE_SAMPLES.values(), 0.0)
    for url in urls:
        with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
            sums = metric_sums(r.read().decode(), _STORAGE_SAMPLES)
        for name, key in _STORAGE_SAMPLES.items():
            out[key] += sums[name]
    return out


def _storage_figures(before: dict[str, float], after: dict[str, float]) -> dict[str, float | None]:
    """Per phase: mean time of one batch's append (from the write to the end of the sync that covered it, and
    to its copies' acknowledgement when replicated), mean sync (a syncfs of group commit, or an fdatasync with
    sync_scope file), and syncs per batch (below 1 when one sync covered several batches); replicated, the mean
    wait for the copies after the leader's own sync and a copy's mean time from the records' arrival to its
    acknowledgement (None without replication)."""
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}

    def mean_ms(name: str) -> float | None:
        n = d.get(f"{name}_count", 0)
        return round(d[f"{name}_sum"] * 1000 / n, 2) if n else None
    appends, syncs = d.get("append_seconds_count", 0), d.get("fsync_seconds_count", 0)
    return {"append_ms_mean": mean_ms("append_seconds"), "sync_ms_mean": mean_ms("fsync_seconds"),
            "syncs_per_batch": round(syncs / appends, 2) if appends else None,
            "copies_wait_ms_mean": mean_ms("copies_wait_seconds"),
            "copy_acknowledge_ms_mean": mean_ms("copy_acknowledge_seconds")}


def _split(items: list, parts: int) -> list[list]:
    return [items[i::parts] for i in range(parts) if items[i::parts]]


def _brokers_cpu(pids: list[int]) -> float | None:
    seconds = [cpu_seconds(pid) for pid in pids]
    return None if None in seconds else sum(seconds)


def _phase(pool: ProcessPoolExecutor, kind: str, urls: list[str], token: str, work: list, generators: int,
           seconds: float, broker_pids: list[int]) -> dict:
    start_at = time.time() + START_DELAY_S
    futures = [pool.submit(generate, kind, token, "bench", part, start_at, seconds)
               for part in _split(work, generators)]
    time.sleep(max(0.0, start_at - time.time()))
    broker_cpu0, t0, storage0 = _brokers_cpu(broker_pids), time.monotonic(), _append_figures(urls)
    results = [f.result() for f in futures]
    elapsed, broker_cpu = time.monotonic() - t0, _brokers_cpu(broker_pids)
    storage = _storage_figures(storage0, _append_figures(urls))
    lat = [x for r in results for x in r["lat"]]
    count = sum(r["count"] for r in results)
    broker_s = broker_cpu - broker_cpu0 if broker_cpu is not None and broker_cpu0 is not None else None
    return {"messages": count, "seconds": round(elapsed, 2), "messages_per_s": round(count / elapsed),
            "latency_ms": percentiles(lat),
            "cpu_cores": {"broker": round(broker_s / elapsed, 2) if broker_s is not None else None,
                          "generators": round(sum(r["cpu_s"] for r in results) / elapsed, 2)},
            # The broker's CPU per request of BATCH messages: what a change to the hot path moves even when other
            # work on a shared machine takes cores away from the broker and so lowers messages_per_s.
            "broker_cpu_ms_per_batch": round(broker_s * 1000 / (count / BATCH), 3) if broker_s and count else None,
            **({"storage": storage} if kind == "produce" else {})}


async def _prepare(meta: str, admin: str, client: str, queues: int) -> dict[int, str]:
    """Creates the topic over every broker and warms each queue up; returns each queue's broker URL."""
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{meta}/v1/topics", json={"topic": "bench", "queues": queues},
                          headers={"Authorization": f"Bearer {admin}"}) as r:
            assert r.status == 201, await r.text()
            version = (await r.json())["version"]
        async with s.get(f"{meta}/v1/routes/bench?min_version={version}",
                         headers={"Authorization": f"Bearer {client}"}) as r:
            assert r.status == 200, await r.text()
            owners = {q["queue"]: q["address"] for q in (await r.json())["queues"]}
        await asyncio.sleep(1.0)  # the brokers learn the route and their budgets
        warm: list[float] = []
        await asyncio.gather(*(produce(s, owners[q], client, "bench", q, time.monotonic() + 1, warm)
                               for q in range(queues)))
        return owners


async def _ends(owners: dict[int, str], client: str) -> dict[int, int]:
    """Each queue's end, from the broker holding it."""
    ends: dict[int, int] = {}
    async with aiohttp.ClientSession() as s:
        for url in sorted(set(owners.values())):
            async with s.get(f"{url}/v1/queues/bench", headers={"Authorization": f"Bearer {client}"}) as r:
                ends.update({q["queue"]: q["max_offset"] for q in (await r.json())["queues"]
                             if owners.get(q["queue"]) == url})
    return ends


def run(args) -> dict:
    with tempfile.TemporaryDirectory(prefix="stator-bench-") as tmp:
        cluster = devcluster.up(os.path.join(tmp, "c"), 3, args.brokers, free_base_port(),
                                extra_broker={"sync_scope": args.sync_scope})
        try:
            meta = cluster["meta"][0]["url"]
            urls = [b["url"] for b in cluster["brokers"]]
            broker_pids = [b["pid"] for b in cluster["brokers"]]
            admin, client = cluster["admin_token"], cluster["client_token"]
            ceiling = disk_ceiling(DISK_CEILING_SECONDS, BATCH, len(BODY), tmp)
            owners = asyncio.run(_prepare(meta, admin, client, args.queues))
            with ProcessPoolExecutor(max_workers=args.generators) as pool:
                slots = [(owners[q], q) for q in (i % args.queues for i in range(args.concurrency))]
                produced = _phase(pool, "produce", urls, client, slots, args.generators, args.seconds, broker_pids)
                ends = asyncio.run(_ends(owners, client))
                reads = [(owners[q], q, end) for q, end in sorted(ends.items())]
                consumed = _phase(pool, "consume", urls, client, reads, args.generators, 0.0, broker_pids)
            disk = ceiling["messages_per_s"]
            return {
                "benchmark": "broker_throughput", "message_bytes": len(BODY), "batch": BATCH, "flush": "fsync",
                "sync_scope": args.sync_scope,
                "wire": WIRE, "pull_max": PULL_MAX,
                "queues": args.queues, "concurrency": args.concurrency, "generators": args.generators,
                "brokers": args.brokers,
                "disk_ceiling": ceiling,
                "produce": {**produced, "of_disk_ceiling": round(produced["messages_per_s"] / disk, 2)},
                "consume": consumed,
                "loadavg": open("/proc/loadavg").read().split()[:3],
            }
        finally:
            devcluster.down(os.path.join(tmp, "c"))


def main() -> None:
    global WIRE, PULL_MAX
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--queues", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--generators", type=int, default=2, help="load generator processes")
    ap.add_argument("--brokers", type=int, default=1, help="broker processes the topic's queues are spread over")
    ap.add_argument("--wire", choices=("binary", "json"), default=WIRE, help="the form of sends and pulls")
    ap.add_argument("--pull-max", type=int, default=PULL_MAX, help="messages a pull asks for (1-1000)")
    ap.add_argument("--sync-scope", choices=SYNC_SCOPES, default=SYNC_SCOPE_FILESYSTEM,
                    help="the brokers' sync_scope: one syncfs for many queues (group commit), or an fdatasync each")
    args = ap.parse_args()
    WIRE, PULL_MAX = args.wire, args.pull_max   # before the generator processes fork
    if not 1 <= PULL_MAX <= 1000:
        ap.error("--pull-max must be between 1 and 1000")
    if args.brokers < 1 or args.queues < args.brokers:
        ap.error("--brokers must be between 1 and --queues")
    print(json.dumps(run(args)))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
