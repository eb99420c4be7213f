"""Stator against etcd, side by side in one run, with one client: small writes and write unavailability.

    python -m ops.bench.vs_etcd [--concurrency 1,64] [--rounds 8] [--duration 3] [--warmup 1]
                                [--failover-trials 3] [--journal-sync fsync|none]

A 3-member etcd (Debian's etcd-server, installed when missing) and a 3-node Stator run at the same time on loopback.
One aiohttp client drives both: etcd's JSON gateway ``POST /v3/kv/put`` (one key, base64 key and value) and Stator's
``PUT /v1/topics/{t}/config`` (one key), each with a distinct value per write, closed loop, round-robin over all
three endpoints of the system, at each concurrency. Rounds alternate between the systems (etcd first in odd rounds,
Stator first in even ones) so both see the same machine; every round has a warm-up and a fixed measured duration.
Then, per trial and per system (alternating the order), open-loop writes go to the two members that will survive,
the leader is killed with SIGKILL, and the time from the kill to the first acknowledged write sent after it is
taken; the member is started again before the next trial.
Ratios are Stator / etcd: above 1 is better for writes/s, below 1 is better for latencies and unavailability.
Prints one JSON object; progress (with /proc/loadavg) goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import signal
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from ops import devcluster

from . import common, etcd_cluster, failover
from .common import say

TOPIC = "bench-vs-etcd"
ETCD_KEY = etcd_cluster.b64("bench-vs-etcd/config")
REQUEST_TIMEOUT_S = 10.0
MAX_WRITES_PER_ROUND = 5_000_000
FAILOVER_RATE_PER_S = 100.0        # open-loop writes to the survivors during a failover trial
FAILOVER_TIMEOUT_S = 3.0           # per write: a write stuck on a dead leader is given up and retried by the next one
FAILOVER_BEFORE_S = 1.5
FAILOVER_GIVE_UP_S = 30.0
RECOVER_TIMEOUT_S = 60.0


@dataclass
class System:
    """One system under test: how to write to its endpoint i, and its processes."""
    name: str
    urls: list[str]
    headers: dict[str, str]
    pids: Any                      # () -> member pids and their children (projection writers), for CPU per write
    kind: str                      # "etcd" or "stator"
    extra: dict[str, Any] = field(default_factory=dict)

    def request(self, i: int, value: str) -> tuple[str, str, bytes]:
        url = self.urls[i % len(self.urls)]
        if self.kind == "etcd":
            return "POST", url + "/v3/kv/put", json.dumps({"key": ETCD_KEY, "value": etcd_cluster.b64(value)}).encode()
        return "PUT", f"{url}/v1/topics/{TOPIC}/config", json.dumps({"k": value}).encode()


async def _write(s: aiohttp.ClientSession, sysm: System, i: int, value: str, timeout_s: float) -> str | None:
    """None on success, else a short error code."""
    method, url, body = sysm.request(i, value)
    try:
        async with s.request(method, url, data=body, headers=sysm.headers,
                             timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
            raw = await r.read()
            if r.status == 200 and not (sysm.kind == "etcd" and b'"error"' in raw):
                return None
            return str(r.status)
    except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
        return type(e).__name__


# -- throughput ---------------------------------------------------------------------------------------------------
async def _round(sysm: System, concurrency: int, warmup_s: float, duration_s: float, tag: str) -> dict[str, Any]:
    by_entry: dict[str, list[float]] = {"leader": [], "followers": []}   # which endpoint the write was sent to
    counter = [0]
    members = sysm.extra["members"]
    leader_idx = members.index(await sysm.extra["leader"]())
    async with common.session(limit=max(concurrency, 1), timeout_s=REQUEST_TIMEOUT_S) as s:
        t_start = time.perf_counter()
        t_measure, t_end = t_start + warmup_s, t_start + warmup_s + duration_s
        tally = common.WriteTally(t_measure)

        async def worker(w: int) -> None:
            while counter[0] < MAX_WRITES_PER_ROUND:
                t0 = time.perf_counter()
                if t0 >= t_end:
                    return
                counter[0] += 1
                n = counter[0]
                code = await _write(s, sysm, n, f"{tag}-{w}-{n}", REQUEST_TIMEOUT_S)
                latency = tally.add(t0, code)
                if latency is not None:
                    by_entry["leader" if n % len(sysm.urls) == leader_idx else "followers"].append(latency)

        cpu0 = {p: common.cpu_seconds(p) for p in sysm.pids()}
        load0 = common.loadavg()
        await asyncio.gather(*(worker(w) for w in range(concurrency)))
        cpu1 = {p: common.cpu_seconds(p) for p in sysm.pids()}
    # A process that started during the round (a projection writer started again) counts from zero; one that ended
    # during it, or could not be read, counts nothing.
    cpu = sum(b - cpu0.get(p, 0.0) for p, b in cpu1.items() if b is not None and cpu0.get(p, 0.0) is not None)
    lat = tally.latencies
    return {"writes_ok": len(lat), "writes_per_s": round(len(lat) / duration_s, 1), "latencies": lat,
            "latencies_by_entry": by_entry,
            "errors": dict(tally.errors), "cpu_ms_per_write": round(cpu * 1000 / max(1, tally.ok_all), 3),
            "loadavg_before": load0}


def _summary(rounds: list[dict[str, Any]], duration_s: float) -> dict[str, Any]:
    lat = [x for r in rounds for x in r["latencies"]]
    ok = sum(r["writes_ok"] for r in rounds)
    lat_ms = common.latency_summary(lat)
    by_entry = {k: [x for r in rounds for x in r["latencies_by_entry"][k]] for k in ("leader", "followers")}
    errors: collections.Counter[str] = collections.Counter()
    for r in rounds:
        errors.update(r["errors"])
    return {"writes_per_s": round(ok / (duration_s * len(rounds)), 1), "p50_ms": lat_ms["p50_ms"],
            "p99_ms": lat_ms["p99_ms"], "max_ms": lat_ms["max_ms"], "errors": dict(errors),
            # Where a write entered: a follower forwards it to the leader (one more hop each way) and answers once
            # it applied it itself.
            "p50_ms_by_entry": {k: common.latency_summary(v)["p50_ms"] for k, v in by_entry.items()},
            "cpu_ms_per_write": round(statistics.median(r["cpu_ms_per_write"] for r in rounds), 3),
            "rounds_writes_per_s": [r["writes_per_s"] for r in rounds],
            "rounds_cpu_ms_per_write": [r["cpu_ms_per_write"] for r in rounds],
            "rounds_loadavg_before": [r["loadavg_before"][0] for r in rounds]}


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


async def throughput(systems: dict[str, System], args: argparse.Namespace) -> list[dict[str, Any]]:
    out = []
    for conc in [int(x) for x in args.concurrency.split(",") if x]:
        rounds: dict[str, list[dict[str, Any]]] = {k: [] for k in systems}
        for r in range(args.rounds):
            order = ["etcd", "stator"] if r % 2 == 0 else ["stator", "etcd"]
            for name in order:
                say(f"vs_etcd: {name} concurrency {conc} round {r + 1}/{args.rounds} (load {common.loadavg()})")
                got = await _round(systems[name], conc, args.warmup, args.duration, f"c{conc}r{r}")
                say(f"  -> {got['writes_per_s']}/s errors {got['errors']}")
                rounds[name].append(got)
        row: dict[str, Any] = {"concurrency": conc}
        for name in systems:
            row[name] = _summary(rounds[name], args.duration)
        e, s = row["etcd"], row["stator"]
        row["ratio_stator_to_etcd"] = {"writes_per_s": _ratio(s["writes_per_s"], e["writes_per_s"]),
                                       "p50_ms": _ratio(s["p50_ms"], e["p50_ms"]),
                                       "p99_ms": _ratio(s["p99_ms"], e["p99_ms"]),
                                       "cpu_ms_per_write": _ratio(s["cpu_ms_per_write"], e["cpu_ms_per_write"])}
        # Round r of each system ran back to back: the spread of these pairs is the noise a verdict must clear.
        row["ratio_by_round"] = {
            k: [_ratio(sv, ev) for sv, ev in zip(s[f"rounds_{k}"], e[f"rounds_{k}"])]
            for k in ("writes_per_s", "cpu_ms_per_write")}
        out.append(row)
    return out


# -- failover -----------------------------------------------------------------------------------------------------
async def _failover_trial(sysm: System, k: int) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    lead = await sysm.extra["leader"]()
    term0 = await sysm.extra["term"]()
    members = sysm.extra["members"]
    survivors = [i for i, m in enumerate(members) if m != lead]
    acks: list[tuple[float, float]] = []   # (sent, done) of acknowledged writes
    failed: collections.Counter[str] = collections.Counter()
    stop = [False]
    tasks: set[asyncio.Task] = set()
    async with common.session(limit=200, timeout_s=FAILOVER_TIMEOUT_S) as s:
        async def one(seq: int) -> None:
            sent = time.perf_counter()
            code = await _write(s, sysm, survivors[seq % len(survivors)], f"f{k}-{seq}", FAILOVER_TIMEOUT_S)
            if code is None:
                acks.append((sent, time.perf_counter()))
            else:
                failed[code] += 1

        async def writer() -> None:
            seq, t0 = 0, time.perf_counter()
            while not stop[0]:
                delay = t0 + seq / FAILOVER_RATE_PER_S - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                seq += 1
                t = asyncio.create_task(one(seq))
                tasks.add(t)
                t.add_done_callback(tasks.discard)

        w = asyncio.create_task(writer())
        await asyncio.sleep(FAILOVER_BEFORE_S)
        t_kill = time.perf_counter()
        await loop.run_in_executor(None, sysm.extra["kill"], lead)
        while time.perf_counter() - t_kill < FAILOVER_GIVE_UP_S and not any(a[0] >= t_kill for a in acks):
            await asyncio.sleep(0.01)
        stop[0] = True
        await w
        if tasks:
            await asyncio.wait(list(tasks), timeout=FAILOVER_TIMEOUT_S + 2)
    # Under load a leader may change between asking and killing: then a follower died and nothing was measured.
    term1 = await sysm.extra["term"]()
    before = [d for snt, d in acks if d < t_kill]
    after = [d for snt, d in acks if snt >= t_kill]
    r = {"trial": k + 1, "killed": lead, "term_before_after": [term0, term1], "valid": term1 > term0,
         "kill_to_first_ok_ms": round((min(after) - t_kill) * 1000, 1) if after else None,
         "gap_ms": round((min(after) - max(before)) * 1000, 1) if after and before else None,
         "failed_writes": dict(failed), "loadavg_before": common.loadavg()}
    say(f"  -> {sysm.name}: kill->first ok {r['kill_to_first_ok_ms']} ms, failed {dict(failed)}")
    await loop.run_in_executor(None, sysm.extra["restart"], lead)
    await sysm.extra["recovered"](lead)
    return r


async def failovers(systems: dict[str, System], trials: int) -> dict[str, Any]:
    got: dict[str, list[dict[str, Any]]] = {k: [] for k in systems}
    for k in range(trials):
        for name in (["etcd", "stator"] if k % 2 == 0 else ["stator", "etcd"]):
            say(f"vs_etcd: failover {name} trial {k + 1}/{trials} (load {common.loadavg()})")
            got[name].append(await _failover_trial(systems[name], k))
    out: dict[str, Any] = {}
    for name, rs in got.items():
        vals = sorted(r["kill_to_first_ok_ms"] for r in rs if r["kill_to_first_ok_ms"] is not None and r["valid"])
        out[name] = {"valid_trials": len(vals), "kill_to_first_ok_ms_median": statistics.median(vals) if vals else None,
                     "kill_to_first_ok_ms_max": vals[-1] if vals else None, "trials": rs}
    if trials:
        out["ratio_stator_to_etcd"] = {"kill_to_first_ok_ms_median": _ratio(
            out["stator"]["kill_to_first_ok_ms_median"], out["etcd"]["kill_to_first_ok_ms_median"])}
    return out


# -- the two systems ----------------------------------------------------------------------------------------------
def _etcd_system(e: etcd_cluster.EtcdCluster) -> System:
    loop = asyncio.get_running_loop()

    async def leader() -> str:
        return await loop.run_in_executor(None, e.leader)

    async def recovered(name: str) -> None:
        await loop.run_in_executor(None, lambda: e.wait_ready([name], RECOVER_TIMEOUT_S))
        await leader()   # the restarted member knows the leader too

    async def term() -> int:
        return await loop.run_in_executor(None, e.term)

    return System("etcd", [e.url(n) for n in e.names], {"Content-Type": "application/json"},
                  lambda: [p for p in (e.pid(n) for n in e.names) if p], "etcd",
                  {"members": e.names, "leader": leader, "term": term, "kill": e.kill,
                   "restart": lambda n: e.start(n, "existing"), "recovered": recovered})


def _stator_system(c: common.BenchCluster, s: aiohttp.ClientSession) -> System:
    async def leader() -> str:
        return await common.leader(s, c)

    async def recovered(node: str) -> None:
        c.reload()
        await failover._catch_up(s, c, node)

    async def term() -> int:
        return max((t for t in (await common.terms(s, c)).values() if t is not None), default=0)

    return System("stator", [c.url(n) for n in c.nodes], {**c.headers("admin"), "Content-Type": "application/json"},
                  lambda: [p for n in c.nodes for p in common.process_tree(c.pid(n))], "stator",
                  {"members": c.nodes, "leader": leader, "term": term,
                   "kill": lambda n: devcluster.stop_member(c.dir, n, signal.SIGKILL),
                   "restart": lambda n: devcluster.start(c.dir, n), "recovered": recovered})


# Per node, what can hold it for a while during the throughput rounds: a full collection (~0.1-0.2 s,
# meta/gc_tuning.py) and a raft snapshot (a forked writer that serializes the whole image beside it).
_HOLDERS = {"full_gc_collections": ("python_gc_collections_total", {"generation": "2"}),
            "snapshots_written": ("stator_meta_raft_snapshots_total", {"kind": "written"})}


async def _holders(s: aiohttp.ClientSession, c: common.BenchCluster) -> dict[str, dict[str, float | None]]:
    return {what: {n: await common.metric_sum(s, c.url(n), name, labels=labels) for n in c.nodes}
            for what, (name, labels) in _HOLDERS.items()}


def _held(before: dict[str, dict[str, float | None]], after: dict[str, dict[str, float | None]]) -> dict[str, Any]:
    return {f"stator_{what}_in_throughput": {n: None if before[what][n] is None or after[what][n] is None
                                             else round(after[what][n] - before[what][n]) for n in nodes}
            for what, nodes in before.items()}


async def run(args: argparse.Namespace, binary: str) -> dict[str, Any]:
    load0 = common.loadavg()
    with etcd_cluster.temp_etcd(binary) as e, \
            common.temp_cluster({"raft_tuning": {"journal_sync": args.journal_sync}}) as c:
        async with common.session() as s:
            brokers = common.SimBrokers(s, c)
            await brokers.register()
            try:
                await common.create_topic(s, c, TOPIC, 4)
                systems = {"etcd": _etcd_system(e), "stator": _stator_system(c, s)}
                held0 = await _holders(s, c)
                rows = await throughput(systems, args)
                held = _held(held0, await _holders(s, c))
                fo = await failovers(systems, args.failover_trials)
            finally:
                await brokers.stop()
            warnings = common.log_warnings(c)
            warning_examples = {n: common.log_tail(c, n, 2, '"level": "warning"') for n in c.nodes}
    return {
        "benchmark": "vs_etcd",
        "setup": {"etcd": f"{etcd_cluster.MEMBERS} members, {_etcd_version(binary)}, default settings (fsync per "
                          "commit), JSON gateway POST /v3/kv/put, one key",
                  "stator": f"3 meta nodes, journal_sync {args.journal_sync}, PUT /v1/topics/{TOPIC}/config, one key",
                  "client": "one Python process, aiohttp, closed loop, keep-alive pool limit = concurrency, "
                            "round-robin over the three endpoints",
                  "rounds": args.rounds, "duration_s": args.duration, "warmup_s": args.warmup,
                  "failover": f"open loop {FAILOVER_RATE_PER_S:g}/s to the two survivors, SIGKILL of the leader, "
                              f"per-write timeout {FAILOVER_TIMEOUT_S} s",
                  "nproc": os.cpu_count()},
        "throughput": rows, "failover": fo, "stator_log_warning_lines": warnings,
        **held,
        "stator_log_warning_examples": warning_examples,
        "loadavg_start": load0, "loadavg_end": common.loadavg(),
    }


def _etcd_version(binary: str) -> str:
    import subprocess
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout
        return out.splitlines()[0].strip() if out else "etcd (version unknown)"
    except (OSError, subprocess.SubprocessError):
        return "etcd (version unknown)"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--concurrency", default="1,64", help="comma-separated writer counts")
    p.add_argument("--rounds", type=int, default=8, help="alternating rounds per system and concurrency")
    p.add_argument("--duration", type=float, default=3.0, help="measured seconds per round")
    p.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds before each round")
    p.add_argument("--failover-trials", type=int, default=3, help="kill -9 trials per system (0: none)")
    p.add_argument("--journal-sync", default="fsync", choices=("fsync", "none"),
                   help="Stator's raft_tuning.journal_sync (etcd always fsyncs)")
    args = p.parse_args()
    if args.rounds < 1 or args.duration <= 0 or args.warmup < 0 or args.failover_trials < 0:
        p.error("--rounds >= 1, --duration > 0, --warmup >= 0, --failover-trials >= 0")
    try:
        binary = etcd_cluster.ensure_installed()
    except etcd_cluster.EtcdMissing as e:
        print(str(e), file=sys.stderr)
        sys.exit(2)
    common.raise_fd_limit()
    common.emit(asyncio.run(run(args, binary)))


if __name__ == "__main__":
    main()
