"""Where a lone writer's write spends its time: its steps through the leader and both followers, with their times.

    python -m ops.bench.write_path [--duration 5] [--warmup 2] [--journal-sync fsync|none]

One closed-loop writer sends `PUT /v1/topics/{t}/config` (one key, a distinct value) to the leader of a fresh
3-node cluster, as ops/bench/writes.py does at concurrency 1. The nodes run with their calls stamped
(ops/bench/write_path_stamps.py, loaded through ops/bench/write_path_probes/sitecustomize.py: nothing in meta/ is
changed), and for every measured write the steps are found among the stamps: the request read by the leader, its
body parsed, the proposal, the journal append, the entries sent, the leader's sync, each follower's read, append,
sync and acknowledgement (``ack1`` the first to acknowledge, ``ack2`` the second), then the leader's read of the first
acknowledgement, the state machine, the answer built and written, and the client's read of it. Prints one JSON
object: per step, the median time from the client's send and its growth over the step before.

The stamps cost about a microsecond a call (the writes/s here is a few percent below writes.py's at 1); the figures
are for finding where the time goes, not for comparing with etcd (ops/bench/vs_etcd.py does that). Each node and
the client share the machine's cores, so a step can include waiting for a core: a follower woken by the leader's send
often runs only once the leader blocks in its own sync.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import tempfile
import time
from typing import Any
from unittest import mock

from . import common, write_path_stamps
from .common import say

TOPIC = "bench-write-path"
REQUEST_TIMEOUT_S = 10.0
DUMP_WAIT_S = 10.0
PROBES_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "write_path_probes")


async def _writes(c: common.BenchCluster, node: str, warmup_s: float,
                  duration_s: float) -> tuple[list[tuple[int, int]], int]:
    """The measured writes' (sent, answered) times in ns (``time.perf_counter_ns``), and how many writes were sent
    in all, warm-up included."""
    url = f"{c.url(node)}/v1/topics/{TOPIC}/config"
    headers = {**c.headers("admin"), "Content-Type": "application/json"}
    writes: list[tuple[int, int]] = []
    async with common.session(limit=1, timeout_s=REQUEST_TIMEOUT_S) as s:
        t_measure = time.perf_counter_ns() + int(warmup_s * 1e9)
        t_end = t_measure + int(duration_s * 1e9)
        seq = 0
        while (t0 := time.perf_counter_ns()) < t_end:
            seq += 1
            async with s.put(url, data=b'{"k":"v%d"}' % seq, headers=headers) as r:
                await r.read()
                if r.status != 200:
                    raise RuntimeError(f"write answered {r.status}")
            if t0 >= t_measure:
                writes.append((t0, time.perf_counter_ns()))
    return writes, seq


def _dump(pids: dict[str, int], out_dir: str) -> dict[str, dict[str, list[int]]]:
    """Each node's stamps (SIGUSR1 has it write them to ``<out_dir>/<pid>.stamps``)."""
    for pid in pids.values():
        os.kill(pid, signal.SIGUSR1)
    deadline = time.monotonic() + DUMP_WAIT_S
    paths = {node: os.path.join(out_dir, f"{pid}{write_path_stamps.SUFFIX}") for node, pid in pids.items()}
    while not all(os.path.exists(p) for p in paths.values()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"no stamps from {[n for n, p in paths.items() if not os.path.exists(p)]}: "
                               "did the nodes load ops/bench/write_path_probes/sitecustomize.py?")
        time.sleep(0.05)
    return {node: write_path_stamps.read_stamps(p) for node, p in paths.items()}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    out_dir = tempfile.mkdtemp(prefix="stator-write-path-")
    # The nodes inherit this process's environment (ops/devcluster.py); it is restored as the cluster stops.
    probes = {"PYTHONPATH": os.pathsep.join(p for p in (PROBES_DIR, os.environ.get("PYTHONPATH")) if p),
              write_path_stamps.DIR_ENV: out_dir}
    try:
        with mock.patch.dict(os.environ, probes), \
                common.temp_cluster({"raft_tuning": {"journal_sync": args.journal_sync}}) as c:
            async with common.session() as s:
                brokers = common.SimBrokers(s, c)
                await brokers.register()
                try:
                    await common.create_topic(s, c, TOPIC, 4)
                    leader = await common.leader(s, c)
                    say(f"write_path: one writer at the leader {leader} for {args.warmup} s + {args.duration} s")
                    cpu0 = {n: common.cpu_seconds(c.pid(n)) for n in c.nodes}
                    writes, sent = await _writes(c, leader, args.warmup, args.duration)
                    cpu1 = {n: common.cpu_seconds(c.pid(n)) for n in c.nodes}
                    stamps = _dump({n: c.pid(n) for n in c.nodes}, out_dir)
                finally:
                    await brokers.stop()
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    followers = [stamps[n] for n in sorted(stamps) if n != leader]
    steps, found = write_path_stamps.step_medians(writes, stamps[leader], followers)
    latencies = sorted((t1 - t0) / 1e9 for t0, t1 in writes)
    return {"benchmark": "write_path", "journal_sync": args.journal_sync, "leader": leader,
            "writes": len(writes), "writes_per_s": round(len(writes) / args.duration, 1),
            **common.latency_summary(latencies), "writes_with_a_path": found,
            "cpu_ms_per_write": {n: round((cpu1[n] - cpu0[n]) * 1000 / sent, 3) for n in c.nodes},
            "steps": steps, "loadavg_after": common.loadavg()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=float, default=5.0, help="measured seconds")
    p.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds first")
    p.add_argument("--journal-sync", default="fsync", choices=("fsync", "none"))
    common.emit(asyncio.run(run(p.parse_args())))


if __name__ == "__main__":
    main()
