"""A meta cluster holding millions of logic queues: memory, snapshot, restart time and route reads.

    python -m ops.bench.scale [--queues 1000000] [--queues-per-topic 1000] [--create-concurrency 8]
                              [--read-seconds 10] [--read-concurrency 16]
    python -m ops.bench.scale --queues 10000000     # the issue's size; about 10 minutes of creation here

Creates ``queues / queues-per-topic`` topics of ``queues-per-topic`` queues (slots 1024) over HTTP with bounded
concurrency (each create carries an Idempotency-Key, so a retried create is safe), with
``raft_tuning.compaction_min_entries = 500`` so pysyncobj compacts (writes raft.snapshot) during the run, and
``compaction_min_time_s = 60`` so that a snapshot holding everything is written soon after the last create. Then:
per-node RSS (VmRSS) and the peak RSS of the forked snapshot writers, snapshot and journal sizes, the restart time
of one follower (kill -9, start, until /readyz is 200 and its applied_version equals the leader's), and
`GET /v1/routes/{t}` of random topics over the three nodes: first closed-loop at concurrency 16 for 10 s (the
throughput a saturated machine gives; latency there is mostly queueing behind the client's own gunzip of ~340 KB per
read), then, once every node says its routes are warm (/readyz routes_warm), paced (open loop, ``--read-rate`` per
second, latency from each read's scheduled start, so a stall delays the reads behind it too). The route read target
is checked on the paced reads. Prints one JSON object, which names the size that ran.

A node's memory is its own process and its projection writer (meta/projection/writer_process.py), both counted
(``rss_mib_*`` give the two and their sum); pysyncobj's forked snapshot writers are reported apart. Targets
(issue 11): at most 400 B of RSS per logic queue per node at 10,000,000 queues, a restart within 60 s, route reads
p99 <= 10 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import random
import signal
import time
from typing import Any

import aiohttp

from meta.projection import writer_zygote
from ops import devcluster

from . import common
from .common import say

SLOTS = 1024
CREATE_TIMEOUT_S = 60.0
CREATE_ATTEMPTS = 5
CATCH_UP_TIMEOUT_S = 900.0
WARM_TIMEOUT_S = 600.0   # every node prerendering every route: ~3 ms each, 10,000 topics at 10,000,000 queues
RESTART_TIMEOUT_S = 900.0
SNAPSHOT_WAIT_S = 600.0
SAMPLE_EVERY_S = 2.0


QUEUE_BYTES_MAX = 400
RESTART_S_MAX = 60
ROUTE_P99_MS_MAX = 10
FULL_SIZE_QUEUES = 10_000_000


def _snapshot_writers(pid: int) -> list[int]:
    """pysyncobj's forked snapshot writers: the node's children but the projection's (its writers' zygote, or a
    writer started afresh where no zygote could be had)."""
    projection = (writer_zygote.ZYGOTE_NAME, writer_zygote.WRITER_NAME)
    return [k for k in common.children(pid) if common.process_name(k) not in projection]


def node_memory(pid: int) -> dict[str, float | None]:
    """RSS (MiB) of a meta node's process, of its projection writer, and the two together."""
    own = common.node_rss_mib(pid)
    writer = sum(common.node_rss_mib(k) or 0 for k in common.process_tree(pid)[1:]
                 if common.process_name(k) == writer_zygote.WRITER_NAME)
    return {"node": own, "projection_writer": writer,
            "total": round(own + writer, 1) if own is not None else None}


class MemorySampler:
    """Every few seconds: each node's RSS (its process and its projection writer) and the RSS of its forked
    children (pysyncobj's snapshot writers)."""

    def __init__(self, c: common.BenchCluster):
        self.c = c
        self.peak_rss: dict[str, float] = collections.defaultdict(float)
        self.peak_child_rss: dict[str, float] = collections.defaultdict(float)
        self.fork_seen: dict[str, int] = collections.defaultdict(int)
        self._task: asyncio.Task | None = None
        self._seen_children: dict[str, set[int]] = collections.defaultdict(set)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(SAMPLE_EVERY_S)

    def sample(self) -> None:
        for m in self.c.info["meta"]:
            n, pid = m["node"], m["pid"]
            rss = node_memory(pid)["total"]
            if rss is not None:
                self.peak_rss[n] = max(self.peak_rss[n], rss)
            kids = _snapshot_writers(pid)
            child_rss = sum(common.node_rss_mib(k) or 0 for k in kids)
            self.peak_child_rss[n] = max(self.peak_child_rss[n], child_rss)
            for k in kids:
                if k not in self._seen_children[n]:
                    self._seen_children[n].add(k)
                    self.fork_seen[n] += 1

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


def _files(c: common.BenchCluster, node: str) -> dict[str, Any]:
    d = os.path.join(c.dir, node, "data")
    out: dict[str, Any] = {}
    for name in ("raft.snapshot", "raft.journal", "projection.db"):
        p = os.path.join(d, name)
        try:
            st = os.stat(p)
            out[name] = {"mib": round(st.st_size / 2 ** 20, 1), "mtime": st.st_mtime}
        except OSError:
            out[name] = None
    return out


async def _create_all(s: aiohttp.ClientSession, c: common.BenchCluster, topics: list[str], per_topic: int,
                      concurrency: int, max_s: float, mem: MemorySampler) -> dict[str, Any]:
    lead = await common.leader(s, c)
    headers = {**c.headers("admin")}
    queue: asyncio.Queue[str] = asyncio.Queue()
    for t in topics:
        queue.put_nowait(t)
    lat: list[float] = []
    errors: collections.Counter[str] = collections.Counter()
    created = [0]
    t0 = time.perf_counter()
    deadline = t0 + max_s
    last_report = [t0]

    async def worker() -> None:
        nonlocal lead
        while time.perf_counter() < deadline:
            try:
                topic = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            for attempt in range(CREATE_ATTEMPTS):
                ts = time.perf_counter()
                try:
                    st, body = await common.call(
                        s, "POST", c.url(lead) + "/v1/topics", {**headers, "Idempotency-Key": f"create-{topic}"},
                        {"topic": topic, "queues": per_topic, "slots": SLOTS}, timeout_s=CREATE_TIMEOUT_S)
                except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
                    st, body = 0, type(e).__name__
                if st in (200, 201) or (st == 409 and isinstance(body, dict)
                                        and body.get("error", {}).get("code") == "TOPIC_EXISTS"):
                    lat.append(time.perf_counter() - ts)
                    created[0] += 1
                    break
                code = body.get("error", {}).get("code") if isinstance(body, dict) else body
                errors[f"{st} {code}"] += 1
                await asyncio.sleep(0.5 * (attempt + 1))
                try:
                    lead = await common.leader(s, c, timeout_s=10)
                except TimeoutError:
                    pass
            now = time.perf_counter()
            if now - last_report[0] >= 15:
                last_report[0] = now
                mem.sample()
                say(f"scale: {created[0]}/{len(topics)} topics in {now - t0:.0f} s "
                    f"({created[0] / (now - t0):.1f}/s), rss MiB {dict(mem.peak_rss)}, load {common.loadavg()}")

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    return {"topics_created": created[0], "queues_created": created[0] * per_topic, "seconds": round(wall, 1),
            "topics_per_s": round(created[0] / wall, 2), "logic_queues_per_s": round(created[0] * per_topic / wall, 1),
            "create_latency": common.latency_summary(lat), "errors_by_code": dict(errors),
            "timed_out": created[0] < len(topics)}


async def _applied(s, c) -> dict[str, int | None]:
    return {n: (v["applied_version"] if v else None) for n, v in (await common.views(s, c)).items()}


async def _wait_all_caught_up(s, c, timeout_s: float) -> float:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout_s:
        a = await _applied(s, c)
        if None not in a.values() and len(set(a.values())) == 1:
            return time.perf_counter() - t0
        await asyncio.sleep(0.5)
    raise TimeoutError(f"nodes did not converge within {timeout_s} s: {await _applied(s, c)}")


async def _wait_snapshots(c: common.BenchCluster, since: float, timeout_s: float) -> dict[str, Any]:
    """Wait until every node has written a raft.snapshot after ``since`` (wall time) and no snapshot writer is
    running. pysyncobj compacts when its log holds > compaction_min_entries or compaction_min_time_s passed."""
    t0 = time.perf_counter()
    fresh = False
    while time.perf_counter() - t0 < timeout_s:
        files = {n: _files(c, n) for n in c.nodes}
        busy = any(_snapshot_writers(c.pid(n)) for n in c.nodes)
        fresh = all(f["raft.snapshot"] and f["raft.snapshot"]["mtime"] > since for f in files.values())
        if fresh and not busy:
            break
        await asyncio.sleep(1.0)
    return {"waited_s": round(time.perf_counter() - t0, 1), "snapshot_written_after_last_create": fresh}


async def _restart(s, c, node: str) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    lead = await common.leader(s, c)
    target = (await common.cluster_view(s, c, lead))["applied_version"]
    await loop.run_in_executor(None, devcluster.stop_member, c.dir, node, signal.SIGKILL)
    t0 = time.perf_counter()
    start_task = loop.run_in_executor(None, devcluster.start, c.dir, node)
    ready_at = None
    caught_at = None
    url = c.url(node)
    while time.perf_counter() - t0 < RESTART_TIMEOUT_S:
        try:
            st, body = await common.call(s, "GET", url + "/readyz", timeout_s=2)
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError):
            st, body = 0, None
        now = time.perf_counter()
        if st == 200:
            ready_at = ready_at or now
            if body.get("applied_version", -1) >= target:
                caught_at = now
                break
        await asyncio.sleep(0.05)
    try:
        await start_task  # devcluster.start's own readiness wait; it gives up after 60 s, we go on measuring
    except (TimeoutError, RuntimeError) as e:
        say(f"scale: devcluster.start: {e}")
    c.reload()
    return {"node": node, "leader": lead, "leader_applied_version": target,
            "ready_s": round(ready_at - t0, 2) if ready_at else None,
            "ready_and_caught_up_s": round(caught_at - t0, 2) if caught_at else None,
            "rss_mib_after_restart": node_memory(c.pid(node))}


async def _read_route(s, c, node: str, topic: str, headers: dict[str, str],
                      errors: collections.Counter[str]) -> bytes | None:
    """One `GET /v1/routes/{topic}` from ``node``: its body, or None with the failure counted in ``errors``."""
    try:
        async with s.get(f"{c.url(node)}/v1/routes/{topic}", headers=headers,
                         timeout=aiohttp.ClientTimeout(total=30)) as r:
            raw = await r.read()
            if r.status == 200:
                return raw
            errors[str(r.status)] += 1
    except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
        errors[type(e).__name__] += 1
    return None


async def _reads(s, c, topics: list[str], seconds: float, concurrency: int) -> dict[str, Any]:
    headers = c.headers("client")
    lat: list[float] = []
    lat_by_node: dict[str, list[float]] = collections.defaultdict(list)
    errors: collections.Counter[str] = collections.Counter()
    sizes: list[int] = []
    rng = random.Random(42)
    t0 = time.perf_counter()
    end = t0 + seconds

    async def worker(i: int) -> None:
        node = c.nodes[i % len(c.nodes)]
        for _ in range(10_000_000):
            ts = time.perf_counter()
            if ts >= end:
                return
            raw = await _read_route(s, c, node, rng.choice(topics), headers, errors)
            if raw is not None:
                d = time.perf_counter() - ts
                lat.append(d)
                lat_by_node[node].append(d)
                sizes.append(len(raw))

    load0 = common.loadavg()
    await asyncio.gather(*(worker(i) for i in range(concurrency)))
    wall = time.perf_counter() - t0
    return {"seconds": seconds, "concurrency": concurrency, "reads_ok": len(lat), "reads_per_s": round(len(lat) / wall, 1),
            **common.latency_summary(lat), "errors_by_code": dict(errors),
            "p99_ms_by_node": {n: common.latency_summary(v)["p99_ms"] for n, v in sorted(lat_by_node.items())},
            "route_bytes_median": sorted(sizes)[len(sizes) // 2] if sizes else None,
            "distinct_topics": len(topics), "loadavg_before": load0, "loadavg_after": common.loadavg()}


async def _prerendered(s, c, node: str) -> int | None:
    """The node's count of routes its warmer rendered (meta/route_warmer.py); None if it does not answer."""
    v = await common.metric_sum(s, c.url(node), "stator_meta_routes_prerendered_total")
    return None if v is None else int(v)


async def _routes_warm(s, c, node: str) -> bool:
    """Whether the node's /readyz says its routes are warm (its warm-up rendered every big route)."""
    try:
        _st, b = await common.call(s, "GET", c.url(node) + "/readyz", timeout_s=5.0)
    except (aiohttp.ClientError, OSError, asyncio.TimeoutError):
        return False
    return isinstance(b, dict) and b.get("routes_warm") is True


async def _wait_warm(s, c, timeout_s: float) -> dict[str, Any]:
    """Until every node says its routes are warm. Its render count alone cannot say it: routes that readers
    rendered first are not the warmer's, and at ten million queues the gzip cache holds only most of them."""
    t0 = time.monotonic()
    warm: dict[str, bool] = {}
    while time.monotonic() - t0 < timeout_s:
        warm = {n: await _routes_warm(s, c, n) for n in c.nodes}
        if all(warm.values()):
            break
        await asyncio.sleep(1.0)
    return {"waited_s": round(time.monotonic() - t0, 1), "routes_warm": warm,
            "prerendered": {n: await _prerendered(s, c, n) for n in c.nodes}, "warm": all(warm.values())}


async def _paced_reads(s, c, topics: list[str], seconds: float, rate: float) -> dict[str, Any]:
    """Open loop: one read every 1/rate s, round-robin over the nodes, whatever the earlier ones are doing."""
    headers = c.headers("client")
    lat_by_node: dict[str, list[float]] = collections.defaultdict(list)
    errors: collections.Counter[str] = collections.Counter()
    rng = random.Random(7)
    loop = asyncio.get_running_loop()

    async def one(node: str, topic: str, scheduled: float) -> None:
        if await _read_route(s, c, node, topic, headers, errors) is not None:
            lat_by_node[node].append(loop.time() - scheduled)

    load0 = common.loadavg()
    start = loop.time()
    tasks = []
    for i in range(int(seconds * rate)):
        scheduled = start + i / rate
        await asyncio.sleep(max(0.0, scheduled - loop.time()))
        tasks.append(asyncio.create_task(one(c.nodes[i % len(c.nodes)], rng.choice(topics), scheduled)))
    await asyncio.gather(*tasks)
    lat = [x for v in lat_by_node.values() for x in v]
    return {"seconds": seconds, "rate_per_s": rate, "reads_ok": len(lat), **common.latency_summary(lat),
            "errors_by_code": dict(errors),
            "p99_ms_by_node": {n: common.latency_summary(v)["p99_ms"] for n, v in sorted(lat_by_node.items())},
            "loadavg_before": load0, "loadavg_after": common.loadavg()}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    per_topic = args.queues_per_topic
    n_topics = max(1, args.queues // per_topic)
    topics = [f"scale-{i:05d}" for i in range(n_topics)]
    extra = {"raft_tuning": {"compaction_min_entries": args.compaction_min_entries,
                             "compaction_min_time_s": args.compaction_min_time_s}}
    out: dict[str, Any] = {"benchmark": "scale",
                           "size": {"queues_requested": args.queues, "topics": n_topics, "queues_per_topic": per_topic,
                                    "slots": SLOTS, "logic_queues": n_topics * per_topic},
                           "setup": {"extra_meta": extra, "create_concurrency": args.create_concurrency}}
    t_all = time.perf_counter()
    with common.temp_cluster(extra_meta=extra) as c:
        async with common.session(limit=64) as s:
            brokers = common.SimBrokers(s, c)
            await brokers.register()
            mem = MemorySampler(c)
            mem.start()
            terms = common.TermWatcher(s, c)
            terms.start()
            try:
                out["rss_mib_empty"] = {m["node"]: node_memory(m["pid"]) for m in c.info["meta"]}
                say(f"scale: creating {n_topics} topics x {per_topic} queues (load {common.loadavg()})")
                load0 = common.loadavg()
                terms.phase = "create"
                out["create"] = await _create_all(s, c, topics, per_topic, args.create_concurrency,
                                                  args.max_create_s, mem)
                out["create"]["loadavg_before"], out["create"]["loadavg_after"] = load0, common.loadavg()
                t_created = time.time()
                say(f"scale: created {out['create']['topics_created']} topics in {out['create']['seconds']} s; "
                    f"waiting for all nodes to apply everything")
                terms.phase = "catch_up_and_snapshot"
                out["catch_up_after_create_s"] = round(await _wait_all_caught_up(s, c, CATCH_UP_TIMEOUT_S), 1)
                out["applied_versions"] = await _applied(s, c)
                out["snapshot_wait"] = await _wait_snapshots(c, t_created, SNAPSHOT_WAIT_S)
                mem.sample()
                out["rss_mib_after_create"] = {m["node"]: node_memory(m["pid"]) for m in c.info["meta"]}
                out["files_after_create"] = {n: _files(c, n) for n in c.nodes}
                for f in out["files_after_create"].values():
                    for v in f.values():
                        if v:
                            v["age_s"] = round(time.time() - v.pop("mtime"), 1)
                out["snapshot_mib"] = {n: (f["raft.snapshot"] or {}).get("mib") for n, f in out["files_after_create"].items()}
                out["loadavg_after_create"] = common.loadavg()
                say(f"scale: rss MiB {out['rss_mib_after_create']}, snapshot MiB {out['snapshot_mib']}")

                lead = await common.leader(s, c)
                victim = next(n for n in c.nodes if n != lead)
                say(f"scale: restarting follower {victim} (kill -9) (load {common.loadavg()})")
                load0 = common.loadavg()
                terms.phase = "restart"
                out["restart"] = await _restart(s, c, victim)
                out["restart"]["loadavg_before"], out["restart"]["loadavg_after"] = load0, common.loadavg()
                say(f"scale: restart {out['restart']}")
                mem.c = c

                say(f"scale: route reads for {args.read_seconds} s at concurrency {args.read_concurrency}")
                terms.phase = "route_reads"
                created_topics = topics[:out["create"]["topics_created"]] or topics[:1]
                out["route_reads"] = await _reads(s, c, created_topics, args.read_seconds, args.read_concurrency)
                say(f"scale: reads {out['route_reads']}")
                terms.phase = "warm_up"
                out["warm_up"] = await _wait_warm(s, c, WARM_TIMEOUT_S)
                say(f"scale: warm-up {out['warm_up']}; paced route reads, {args.read_rate}/s for {args.read_seconds} s")
                terms.phase = "paced_reads"
                out["route_reads_paced"] = await _paced_reads(s, c, created_topics, args.read_seconds, args.read_rate)
                say(f"scale: paced reads {out['route_reads_paced']}")
                mem.sample()
                out["rss_mib_after_reads"] = {m["node"]: node_memory(m["pid"]) for m in c.info["meta"]}
                out["rss_mib_peak"] = dict(mem.peak_rss)
                out["snapshot_writer_rss_mib_peak"] = dict(mem.peak_child_rss)
                out["snapshot_writers_seen"] = dict(mem.fork_seen)
                out["raft_terms"] = await common.terms(s, c)
            finally:
                await terms.stop()
                out["elections"] = terms.summary()
                await mem.stop()
                await brokers.stop()
            out["node_log_warning_lines"] = common.log_warnings(c)
    out["total_s"] = round(time.perf_counter() - t_all, 1)
    queues = n_topics * per_topic
    settled = [v["total"] for v in out.get("rss_mib_after_create", {}).values() if v.get("total")]
    peak = max(out.get("rss_mib_peak", {}).values(), default=0)
    out["rss_bytes_per_queue"] = {"after_create_max": round(max(settled, default=0) * 2 ** 20 / queues),
                                  "peak": round(peak * 2 ** 20 / queues)}
    out["targets"] = {"rss_bytes_per_queue_max": QUEUE_BYTES_MAX, "restart_s_max": RESTART_S_MAX,
                      "route_read_p99_ms_max": ROUTE_P99_MS_MAX, "queues": FULL_SIZE_QUEUES}
    out["checks"] = {
        "rss_per_queue_after_create": out["rss_bytes_per_queue"]["after_create_max"] <= QUEUE_BYTES_MAX,
        "restart": (out.get("restart", {}).get("ready_and_caught_up_s") or 1e9) <= RESTART_S_MAX,
        "route_read_p99": (out.get("route_reads_paced", {}).get("p99_ms") or 1e9) <= ROUTE_P99_MS_MAX,
        "full_size": queues >= FULL_SIZE_QUEUES and not out.get("create", {}).get("timed_out", True),
    }
    out["loadavg_end"] = common.loadavg()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--queues", type=int, default=1_000_000, help="logic queues in total")
    p.add_argument("--queues-per-topic", type=int, default=1000)
    p.add_argument("--create-concurrency", type=int, default=8)
    p.add_argument("--max-create-s", type=float, default=3600.0, help="stop creating after this long")
    p.add_argument("--compaction-min-entries", type=int, default=500)
    p.add_argument("--compaction-min-time-s", type=int, default=60,
                   help="so that a snapshot covering the last creates is written soon after them")
    p.add_argument("--read-seconds", type=float, default=10.0)
    p.add_argument("--read-concurrency", type=int, default=16)
    p.add_argument("--read-rate", type=float, default=100.0, help="paced reads per second (open loop)")
    args = p.parse_args()
    common.emit(asyncio.run(run(args)))


if __name__ == "__main__":
    main()
