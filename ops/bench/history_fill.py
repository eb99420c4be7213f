"""The whole history on a node that lost it: how fast a projection fills from peers, reads back, and rebuilds.

    python -m ops.bench.history_fill [--events 20000] [--window 1000] [--concurrency 16]

A three-node cluster with a small history window (``history_window``) takes ``--events`` small writes; then one
follower is stopped, its projection deleted and the node started again: the image holds only the window, so every
older version comes from its peers (meta/projection_gap.py). Measured: the time until that node's /readyz says its
projection is complete (events/s filled), the time to read its whole /v1/history (projection, then image), then,
on the stopped node, ``stator meta rebuild-projection --from-peer`` and ``--from-export`` (after ``stator export``).
Prints one JSON object; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

import aiohttp

from client.admin import AdminClient
from meta.export.exporter import export
from ops import devcluster

from . import common
from .common import say

TOPIC = "bench-history"
WAIT_S_MAX = 600.0
CLI_TIMEOUT_S = 1_800


async def _write(s, c: common.BenchCluster, leader: str, events: int, concurrency: int) -> float:
    url = f"{c.url(leader)}/v1/topics/{TOPIC}/config"
    left = [events]

    async def worker(i: int) -> None:
        n = 0
        while left[0] > 0:
            left[0] -= 1
            n += 1
            st, body = await common.call(s, "PUT", url, c.headers("admin"), {"k": f"w{i}-{n}"})
            if st != 200:
                raise RuntimeError(f"write failed: {st} {body}")
    started = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(concurrency)))
    return time.perf_counter() - started


async def _until_complete(s, c: common.BenchCluster, node: str, version: int) -> float:
    started = time.perf_counter()
    while time.perf_counter() - started < WAIT_S_MAX:
        try:
            st, b = await common.call(s, "GET", c.url(node) + "/readyz", timeout_s=2.0)
            if b and b["projection_complete"] and b["projection_position"] >= version:
                return time.perf_counter() - started
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError):  # a node starting up
            pass
        await asyncio.sleep(0.1)
    raise TimeoutError(f"{node}'s projection did not reach {version} in {WAIT_S_MAX} s")


async def _read_all(c: common.BenchCluster, node: str) -> tuple[int, float]:
    started = time.perf_counter()
    async with AdminClient([c.url(node)], c.info["client_token"], monotonic_reads=False) as admin:
        n = 0
        async for e in admin.iter_history(after=0, page=10_000):
            n += 1
            assert e["version"] == n, (e["version"], n)
    return n, time.perf_counter() - started


def _rebuild(c: common.BenchCluster, node: str, *source: str) -> float:
    cfg = os.path.join(c.dir, node, "config.json")
    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "ops.cli", "meta", "rebuild-projection", "--config", cfg, *source],
                         capture_output=True, text=True, timeout=CLI_TIMEOUT_S)
    if out.returncode != 0:
        raise RuntimeError(f"rebuild-projection {source[:1]} failed: {out.stderr}")
    return time.perf_counter() - started


def _drop_projection(c: common.BenchCluster, node: str) -> None:
    db = os.path.join(c.dir, node, "data", "projection.db")
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(db + suffix):
            os.remove(db + suffix)


async def _measure(s, c: common.BenchCluster, leader: str, events: int, concurrency: int, out: str,
                   result: dict[str, Any]) -> None:
    st, body = await common.call(s, "POST", c.url(leader) + "/v1/topics", c.headers("admin"),
                                 {"topic": TOPIC, "queues": 1})
    assert st == 201, body
    write_s = await _write(s, c, leader, events, concurrency)
    st, view = await common.call(s, "GET", c.url(leader) + "/v1/cluster", c.headers("client"))
    version = view["applied_version"]
    result["writes_per_s"] = round(events / write_s)
    for n in c.nodes:
        await _until_complete(s, c, n, version)
    node = next(n for n in c.nodes if n != leader)
    say(f"{node}: stopped, projection deleted, started again ({version} versions, window {result['window']})")
    await asyncio.to_thread(devcluster.stop_member, c.dir, node)
    _drop_projection(c, node)
    await asyncio.to_thread(devcluster.start, c.dir, node)
    fill_s = await _until_complete(s, c, node, version)
    result["fill_from_peers"] = {"versions": version, "seconds": round(fill_s, 2),
                                 "versions_per_s": round(version / fill_s), "loadavg": common.loadavg()}
    n, read_s = await _read_all(c, node)
    result["read_whole_history"] = {"versions": n, "seconds": round(read_s, 2),
                                    "versions_per_s": round(n / read_s)}
    started = time.perf_counter()
    exported = await export([c.url(leader)], c.info["client_token"], out)
    result["export"] = {"versions": exported.last_version, "seconds": round(time.perf_counter() - started, 2)}
    await asyncio.to_thread(devcluster.stop_member, c.dir, node)
    for label, source in (("rebuild_from_peer", ["--from-peer", c.url(leader), "--token",
                                                 c.info["client_token"]]),
                          ("rebuild_from_export", ["--from-export", out])):
        _drop_projection(c, node)
        say(f"{node}: {label}")
        seconds = await asyncio.to_thread(_rebuild, c, node, *source)
        result[label] = {"versions": version, "seconds": round(seconds, 2),
                         "versions_per_s": round(version / seconds)}


async def run(events: int, window: int, concurrency: int) -> dict[str, Any]:
    result: dict[str, Any] = {"events": events, "window": window, "concurrency": concurrency,
                              "loadavg_before": common.loadavg()}
    with common.temp_cluster({"history_window": window}) as c, tempfile.TemporaryDirectory() as out:
        async with common.session() as s:
            leader = await common.leader(s, c)
            sims = common.SimBrokers(s, c, ("b1",))
            await sims.register()
            try:
                await _measure(s, c, leader, events, concurrency, out, result)
            finally:
                await sims.stop()
    result["loadavg_after"] = common.loadavg()
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=20_000)
    p.add_argument("--window", type=int, default=1_000)
    p.add_argument("--concurrency", type=int, default=16)
    a = p.parse_args()
    common.emit(asyncio.run(run(a.events, a.window, a.concurrency)))


if __name__ == "__main__":
    main()
