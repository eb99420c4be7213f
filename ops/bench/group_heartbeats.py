"""Members of exclusive groups heartbeating against the three-node cluster, with admin writes alongside (issue 7).

    python -m ops.bench.group_heartbeats [--members 10000] [--groups 1000] [--topics 10] [--queues 16]
        [--interval 3] [--duration 60] [--target leader|follower] [--leave-trials 20]

Each member joins with one heartbeat, then heartbeats on its own schedule every ``--interval`` seconds, spread evenly
(open loop: a heartbeat sent late is measured from its scheduled time too, so a saturated generator shows as
lateness, not as a slow meta). Members release what an answer revoked in their next heartbeat, as real clients do.
A closed-loop admin writer (``PUT /v1/topics/{t}/config``, one at a time) runs alongside. Then, apart, the time from
a member's leave to its queues being owned again by the other member of its group, ``--leave-trials`` times.
Targets: heartbeats sustained (none late past a lease, no lease lost), admin write p99 < 100 ms.
Prints one JSON object; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import time
from typing import Any

import aiohttp

from . import common
from .common import say

REQUEST_TIMEOUT_S = 10.0
POOL_CONNECTIONS_MAX = 256
JOIN_CONCURRENCY = 64
LEAVE_POLL_S = 0.01
LEAVE_TRIAL_TIMEOUT_S = 30.0
ADMIN_TOPIC = "bench-admin"


class Member:
    def __init__(self, group: str, name: str, topic: str):
        self.group, self.name, self.topic = group, name, topic
        self.held: dict[int, int] = {}       # queue -> token, from the last answer
        self.release: list[dict[str, Any]] = []

    def body(self) -> bytes:
        b: dict[str, Any] = {"member": self.name, "topics": [self.topic], "mode": "exclusive"}
        if self.release:
            b["released"] = self.release
        return json.dumps(b).encode()

    def answered(self, answer: dict[str, Any], sent_release: list) -> None:
        now = {a["queue"]: a["token"] for a in answer["assignments"]}
        if sent_release:
            self.release = [r for r in self.release if r not in sent_release]
        self.release += [{"topic": self.topic, "queue": q, "token": t} for q, t in self.held.items() if q not in now]
        self.held = now


class Stats:
    def __init__(self) -> None:
        self.lat: list[float] = []
        self.late: list[float] = []
        self.errors: collections.Counter[str] = collections.Counter()
        self.sent = 0


async def heartbeat(s: aiohttp.ClientSession, url: str, headers: dict[str, str], m: Member, stats: Stats,
                    scheduled: float | None) -> bool:
    release = list(m.release)
    t0 = time.perf_counter()
    stats.sent += 1
    if scheduled is not None:
        stats.late.append(max(0.0, t0 - scheduled))
    try:
        async with s.post(f"{url}/v1/groups/{m.group}/heartbeat", data=m.body(), headers=headers) as r:
            raw = await r.read()
            if r.status != 200:
                stats.errors[f"{r.status} {_code(raw)}"] += 1
                return False
            m.answered(json.loads(raw), release)
    except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
        stats.errors[type(e).__name__] += 1
        return False
    # From the scheduled time: a late send counts against the run, not in meta's favour.
    stats.lat.append(time.perf_counter() - (scheduled if scheduled is not None else t0))
    return True


def _code(raw: bytes) -> str:
    try:
        return json.loads(raw)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return "?"


async def join_all(s, url, headers, members: list[Member]) -> tuple[float, Stats]:
    stats = Stats()
    queue = collections.deque(members)
    t0 = time.perf_counter()

    async def worker() -> None:
        while queue:
            m = queue.popleft()
            for _ in range(5):
                if await heartbeat(s, url, headers, m, stats, None):
                    break
                await asyncio.sleep(0.2)
    await asyncio.gather(*(worker() for _ in range(JOIN_CONCURRENCY)))
    return time.perf_counter() - t0, stats


async def steady(s, url, headers, members: list[Member], interval_s: float, duration_s: float) -> Stats:
    stats = Stats()
    start = time.perf_counter() + 0.5
    end = start + duration_s
    n = len(members)

    async def one(i: int, m: Member) -> None:
        at = start + interval_s * i / n
        while at < end:
            delay = at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            await heartbeat(s, url, headers, m, stats, at)
            at += interval_s
    await asyncio.gather(*(one(i, m) for i, m in enumerate(members)))
    return stats


async def admin_writer(s, url: str, headers: dict[str, str], stop: asyncio.Event) -> tuple[list[float], int]:
    lat, errors, seq = [], 0, 0
    while not stop.is_set():
        seq += 1
        t0 = time.perf_counter()
        try:
            async with s.put(f"{url}/v1/topics/{ADMIN_TOPIC}/config", data=b'{"k":"v%d"}' % seq,
                             headers={**headers, "Content-Type": "application/json"}) as r:
                await r.read()
                if r.status == 200:
                    lat.append(time.perf_counter() - t0)
                else:
                    errors += 1
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError):
            errors += 1
    return lat, errors


async def leave_trials(s, url, headers, trials: int, queues: int) -> dict[str, Any]:
    """Two members of one group; one leaves; how long until the other owns every queue (its heartbeats say so)."""
    stats = Stats()
    stay, go = Member("bench-leave", "stay", "bench-leave"), Member("bench-leave", "go", "bench-leave")
    took: list[float] = []
    for _ in range(trials):
        deadline = time.perf_counter() + LEAVE_TRIAL_TIMEOUT_S
        while not (stay.held and go.held and len(stay.held) + len(go.held) == queues):   # both hold a share
            for m in (stay, go):
                await heartbeat(s, url, headers, m, stats, None)
            if time.perf_counter() > deadline:
                raise RuntimeError("leave trial: the members never shared the queues")
            await asyncio.sleep(LEAVE_POLL_S)
        t0 = time.perf_counter()
        async with s.post(f"{url}/v1/groups/bench-leave/leave", json={"member": "go"}, headers=headers) as r:
            await r.read()
        go.held = {}
        while len(stay.held) < queues:
            await heartbeat(s, url, headers, stay, stats, None)
            if time.perf_counter() - t0 > LEAVE_TRIAL_TIMEOUT_S:
                raise RuntimeError("leave trial: the queues were not owned again")
        took.append(time.perf_counter() - t0)
    return {"trials": trials, **common.latency_summary(took), "heartbeat_errors": dict(stats.errors)}


async def lost_leases(s, c: common.BenchCluster, node: str, after: int) -> int:
    """Members expired by meta after version ``after``: a member that heartbeats on time never is."""
    lost, cursor = 0, after
    while True:
        st, body = await common.call(s, "GET", f"{c.url(node)}/v1/history?after={cursor}&limit=10000",
                                     c.headers("client"))
        if st != 200 or not body["events"]:
            return lost
        lost += sum(e["type"] == "GroupMemberLeft" and e["data"]["reason"] == "lease_expired" for e in body["events"])
        if body["next_after"] <= cursor:
            return lost
        cursor = body["next_after"]


def summary(stats: Stats, interval_s: float, duration_s: float, members: int) -> dict[str, Any]:
    late = sorted(stats.late)
    return {"offered_per_s": round(members / interval_s, 1), "sent": stats.sent, "answered": len(stats.lat),
            "failed": sum(stats.errors.values()), "errors_by_code": dict(stats.errors),
            "answered_per_s": round(len(stats.lat) / duration_s, 1), **common.latency_summary(stats.lat),
            "generator_late_p50_ms": _ms(common.pct(late, 50)), "generator_late_p99_ms": _ms(common.pct(late, 99)),
            "generator_late_max_ms": _ms(late[-1] if late else None)}


def _ms(v: float | None) -> float | None:
    return None if v is None else round(v * 1000, 2)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    common.raise_fd_limit()
    topics = [f"bench-g{i}" for i in range(args.topics)]
    members = [Member(f"grp{g}", f"m{i}", topics[g % len(topics)])
               for i in range(args.members) for g in [i % args.groups]]
    with common.temp_cluster() as c:
        async with common.session(limit=POOL_CONNECTIONS_MAX, timeout_s=REQUEST_TIMEOUT_S) as s:
            brokers = common.SimBrokers(s, c)
            await brokers.register()
            for t in [*topics, ADMIN_TOPIC]:
                await common.create_topic(s, c, t, args.queues)
            await common.create_topic(s, c, "bench-leave", args.queues)
            lead = await common.leader(s, c)
            node = lead if args.target == "leader" else next(n for n in c.nodes if n != lead)
            url, headers = c.url(node), {**c.headers("client"), "Content-Type": "application/json"}
            say(f"groups: {args.members} members in {args.groups} groups joining through {args.target} {node}")
            join_s, join_stats = await join_all(s, url, headers, members)
            say(f"  joined in {join_s:.1f} s ({len(join_stats.errors)} error kinds: {dict(join_stats.errors)})")
            st, cl = await common.call(s, "GET", f"{c.url(lead)}/v1/cluster", c.headers("client"))
            version0 = cl["applied_version"]
            terms0 = await common.terms(s, c)
            cpu0 = {n: common.cpu_seconds(c.pid(n)) for n in c.nodes}
            generator_cpu0 = time.process_time()
            stop = asyncio.Event()
            writer = asyncio.create_task(admin_writer(s, c.url(lead), c.headers("admin"), stop))
            say(f"  steady: every {args.interval} s for {args.duration} s (load {common.loadavg()})")
            t0 = time.perf_counter()
            stats = await steady(s, url, headers, members, args.interval, args.duration)
            wall = time.perf_counter() - t0
            stop.set()
            admin_lat, admin_errors = await writer
            cpu = {n: round((common.cpu_seconds(c.pid(n)) - cpu0[n]) / wall, 2) for n in c.nodes}
            cpu["generator"] = round((time.process_time() - generator_cpu0) / wall, 2)
            terms1 = await common.terms(s, c)
            lost = await lost_leases(s, c, lead, version0)
            beats = summary(stats, args.interval, args.duration, args.members)
            say(f"  -> {beats['answered_per_s']}/s of {beats['offered_per_s']}/s, p50 {beats['p50_ms']} ms "
                f"p99 {beats['p99_ms']} ms, failed {beats['failed']}, lost leases {lost}, cpu {cpu}")
            leave = await leave_trials(s, c.url(lead), headers, args.leave_trials, args.queues)
            say(f"  leave -> owned again: p50 {leave['p50_ms']} ms p99 {leave['p99_ms']} ms")
            await brokers.stop()
            admin = common.latency_summary(admin_lat)
    return {
        "benchmark": "group_heartbeats", "members": args.members, "groups": args.groups, "topics": args.topics,
        "queues_per_topic": args.queues, "interval_s": args.interval, "duration_s": args.duration,
        "target": args.target, "target_node": node, "leader": lead, "generator_processes": 1,
        "join_s": round(join_s, 2), "join_errors": dict(join_stats.errors),
        "heartbeats": beats, "leases_lost": lost,
        "admin_writes": {"ok": len(admin_lat), "errors": admin_errors, **admin},
        "cpu_cores_busy": cpu, "raft_terms_before_after": {n: [terms0[n], terms1[n]] for n in c.nodes},
        "leave_to_owned_again": leave,
        "checks": {"heartbeats_sustained": beats["failed"] == 0 and lost == 0,
                   "admin_write_p99_under_100_ms": admin["p99_ms"] is not None and admin["p99_ms"] < 100},
        "loadavg_after": common.loadavg(),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--members", type=int, default=10_000)
    p.add_argument("--groups", type=int, default=1_000)
    p.add_argument("--topics", type=int, default=10)
    p.add_argument("--queues", type=int, default=16)
    p.add_argument("--interval", type=float, default=3.0)
    p.add_argument("--duration", type=float, default=60.0)
    p.add_argument("--target", choices=("leader", "follower"), default="leader")
    p.add_argument("--leave-trials", type=int, default=20)
    common.emit(asyncio.run(run(p.parse_args())))


if __name__ == "__main__":
    main()
