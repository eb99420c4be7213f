"""Shared pieces of the meta benchmarks: a throw-away cluster on a free port range, HTTP helpers, simulated
brokers, percentiles, and the machine's load next to every figure.

Every benchmark prints ONE JSON object on stdout; progress goes to stderr through ``say``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import random
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from ops import devcluster

META_NODES = 3
SIM_BROKERS = ("b1", "b2", "b3")
SIM_BROKER_ADDRESS = "http://127.0.0.1:1"
HEARTBEAT_EVERY_S = 2.0
# Simulated brokers send no data, so their sessions are made long enough to outlast any benchmark.
LONG_SESSION_MS = 3_600_000


def say(*parts: Any) -> None:
    print(time.strftime("%H:%M:%S"), *parts, file=sys.stderr, flush=True)


def emit(result: dict[str, Any]) -> None:
    print(json.dumps(result, indent=2, sort_keys=False))
    sys.stdout.flush()


def loadavg() -> list[float]:
    with open("/proc/loadavg") as f:
        return [float(x) for x in f.read().split()[:3]]


def raise_fd_limit(want: int = 65536) -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


# -- ports and the cluster --------------------------------------------------------------------------------------
free_base_port = devcluster.free_base_port  # below the ephemeral range, see ops/devcluster.py


def free_port(tries: int = 500) -> int:
    """One free port on 127.0.0.1 below the ephemeral range (for a peer server such as redis-server), for the same
    reason as ``free_base_port``."""
    low, high = devcluster.port_range()
    for _ in range(tries):
        port = random.randrange(low, high)
        if devcluster.port_free(port):
            return port
    raise RuntimeError("no free port below the ephemeral range")


@contextlib.contextmanager
def temp_cluster(extra_meta: dict[str, Any] | None = None, keep: bool = False) -> Iterator["BenchCluster"]:
    """Three meta nodes, no real brokers, in a temp dir on a free port range; always stopped, and removed unless
    ``keep`` or the benchmark failed (then its logs and data stay for a look, and the dir is named)."""
    d = tempfile.mkdtemp(prefix="stator-bench-")
    base = free_base_port()
    meta = {"session_timeout_ms": LONG_SESSION_MS, **(extra_meta or {})}
    say(f"cluster: starting {META_NODES} meta nodes in {d} on ports {base}..{base + 2 * META_NODES - 1}")
    started = time.monotonic()
    try:
        info = devcluster.up(d, META_NODES, 0, base, extra_meta=meta)
        say(f"cluster: ready in {time.monotonic() - started:.1f} s")
        yield BenchCluster(d, info)
    except BaseException:
        keep = True
        raise
    finally:
        say("cluster: stopping")
        try:
            if os.path.exists(os.path.join(d, "cluster.json")):
                devcluster.down(d)
        finally:
            if keep:
                say(f"cluster: kept {d}")
            else:
                shutil.rmtree(d, ignore_errors=True)


class BenchCluster:
    def __init__(self, dir_: str, info: dict[str, Any]):
        self.dir = dir_
        self.info = info

    def reload(self) -> None:
        self.info = devcluster.load(self.dir)

    @property
    def nodes(self) -> list[str]:
        return [m["node"] for m in self.info["meta"]]

    def url(self, node: str) -> str:
        return next(m["url"] for m in self.info["meta"] if m["node"] == node)

    def pid(self, node: str) -> int:
        self.reload()
        return next(m["pid"] for m in self.info["meta"] if m["node"] == node)

    def headers(self, role: str = "admin") -> dict[str, str]:
        return {"Authorization": f"Bearer {self.info[role + '_token']}"}

    def log_path(self, node: str) -> str:
        return os.path.join(self.dir, "logs", f"{node}.log")


# -- HTTP ---------------------------------------------------------------------------------------------------------
def session(limit: int = 100, timeout_s: float = 30.0) -> aiohttp.ClientSession:
    conn = aiohttp.TCPConnector(limit=limit, limit_per_host=limit, keepalive_timeout=60, force_close=False)
    return aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=timeout_s))


async def call(s: aiohttp.ClientSession, method: str, url: str, headers: dict[str, str] | None = None,
               body: Any = None, timeout_s: float = 30.0) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    h = dict(headers or {})
    if data is not None:
        h["Content-Type"] = "application/json"
    async with s.request(method, url, data=data, headers=h, timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
        raw = await r.read()
        try:
            return r.status, json.loads(raw) if raw else None
        except ValueError:
            return r.status, raw.decode(errors="replace")


def metric_sums(text: str, names: Iterable[str], labels: dict[str, str] | None = None) -> dict[str, float]:
    """Per sample name in ``names``, the sum of its samples (labels summed over, or only those carrying every label
    of ``labels``) in a /metrics text. prometheus_client's own parser: the exposition format has escapes and comments
    a split on spaces gets wrong."""
    sums = dict.fromkeys(names, 0.0)
    wanted = (labels or {}).items()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in sums and all(sample.labels.get(k) == v for k, v in wanted):
                sums[sample.name] += sample.value
    return sums


async def metric_sum(s: aiohttp.ClientSession, url: str, name: str, timeout_s: float = 10.0,
                     labels: dict[str, str] | None = None) -> float | None:
    """The sum of every sample named ``name`` in ``url``'s /metrics (``metric_sums``); None if it does not answer."""
    try:
        async with s.get(f"{url}/metrics", timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
            text = await r.text()
        return metric_sums(text, [name], labels)[name]
    except (aiohttp.ClientError, OSError, asyncio.TimeoutError, ValueError):
        return None


async def cluster_view(s: aiohttp.ClientSession, c: BenchCluster, node: str, timeout_s: float = 2.0) -> dict | None:
    try:
        st, b = await call(s, "GET", c.url(node) + "/v1/cluster", c.headers("client"), timeout_s=timeout_s)
        return b if st == 200 else None
    except (aiohttp.ClientError, OSError, asyncio.TimeoutError):
        return None


async def views(s: aiohttp.ClientSession, c: BenchCluster, nodes: list[str] | None = None) -> dict[str, dict | None]:
    nodes = nodes or c.nodes
    got = await asyncio.gather(*(cluster_view(s, c, n) for n in nodes))
    return dict(zip(nodes, got))


async def leader(s: aiohttp.ClientSession, c: BenchCluster, nodes: list[str] | None = None,
                 timeout_s: float = 30.0) -> str:
    """The node every reachable node (of ``nodes``) names as leader."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        vs = [v for v in (await views(s, c, nodes)).values() if v]
        seen = {v["leader"] for v in vs}
        if vs and len(seen) == 1 and None not in seen:
            return seen.pop()
        await asyncio.sleep(0.05)
    raise TimeoutError("no agreed leader")


async def terms(s: aiohttp.ClientSession, c: BenchCluster) -> dict[str, int | None]:
    return {n: (v["term"] if v else None) for n, v in (await views(s, c)).items()}


# -- simulated brokers ------------------------------------------------------------------------------------------
class SimBrokers:
    """Registers brokers that exist only as names and keeps their sessions alive with empty heartbeats, with the
    admin token: they have no tokens of their own, and an operator may act for any broker."""

    def __init__(self, s: aiohttp.ClientSession, c: BenchCluster, names: tuple[str, ...] = SIM_BROKERS):
        self.s, self.c, self.names = s, c, names
        self.epochs: dict[str, int] = {}
        self._task: asyncio.Task | None = None
        self.heartbeat_errors = 0

    async def register(self) -> None:
        for b in self.names:
            for attempt in range(50):
                node = self.c.nodes[attempt % len(self.c.nodes)]
                try:
                    st, body = await call(self.s, "PUT", f"{self.c.url(node)}/v1/brokers/{b}", self.c.headers("admin"),
                                          {"address": SIM_BROKER_ADDRESS}, timeout_s=10)
                except (aiohttp.ClientError, OSError, asyncio.TimeoutError):
                    st, body = 0, None
                if st == 200:
                    self.epochs[b] = body["epoch"]
                    break
                await asyncio.sleep(0.2)
            else:
                raise RuntimeError(f"could not register broker {b}")
        self._task = asyncio.create_task(self._beat())

    async def _beat(self) -> None:
        i = 0
        while True:
            await asyncio.sleep(HEARTBEAT_EVERY_S)
            for b, epoch in self.epochs.items():
                i += 1
                node = self.c.nodes[i % len(self.c.nodes)]
                try:
                    st, _ = await call(self.s, "POST", f"{self.c.url(node)}/v1/brokers/{b}/heartbeat",
                                       self.c.headers("admin"), {"epoch": epoch, "queues": {}}, timeout_s=2)
                    if st != 200:
                        self.heartbeat_errors += 1
                except (aiohttp.ClientError, OSError, asyncio.TimeoutError):
                    self.heartbeat_errors += 1

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


async def create_topic(s: aiohttp.ClientSession, c: BenchCluster, topic: str, queues: int, node: str | None = None,
                       slots: int | None = None) -> dict:
    body: dict[str, Any] = {"topic": topic, "queues": queues}
    if slots is not None:
        body["slots"] = slots
    st, b = await call(s, "POST", c.url(node or c.nodes[0]) + "/v1/topics", c.headers("admin"), body, timeout_s=30)
    if st not in (200, 201):
        raise RuntimeError(f"create topic {topic}: {st} {b}")
    return b


# -- figures ------------------------------------------------------------------------------------------------------
def pct(sorted_vals: list[float], p: float) -> float | None:
    """Nearest-rank percentile of an ascending list."""
    if not sorted_vals:
        return None
    k = max(0, min(len(sorted_vals) - 1, int(-(-p * len(sorted_vals) // 100)) - 1))
    return sorted_vals[k]


def latency_summary(seconds: list[float]) -> dict[str, float | None]:
    v = sorted(seconds)
    r = lambda x: None if x is None else round(x * 1000, 3)  # noqa: E731
    return {"p50_ms": r(pct(v, 50)), "p90_ms": r(pct(v, 90)), "p99_ms": r(pct(v, 99)), "max_ms": r(v[-1] if v else None)}


class WriteTally:
    """The closed-loop writes of one run: every success, warm-up included (CPU per write covers both), and the
    latencies and error codes of the writes sent in the measured window (from ``t_measure`` on)."""

    def __init__(self, t_measure: float):
        self.t_measure = t_measure
        self.ok_all = 0
        self.latencies: list[float] = []
        self.errors: collections.Counter[str] = collections.Counter()

    def add(self, t0: float, code: str | None) -> float | None:
        """One write sent at ``t0`` (``time.perf_counter``) and answered now; ``code`` is None on success. Its
        latency when it counts in the window (sent in it, and succeeded), else None."""
        t1 = time.perf_counter()
        if code is None:
            self.ok_all += 1
        if t0 < self.t_measure:
            return None
        if code is not None:
            self.errors[code] += 1
            return None
        self.latencies.append(t1 - t0)
        return t1 - t0


def node_rss_mib(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


def children(pid: int) -> list[int]:
    """Child processes of ``pid``, whichever of its threads forked them (pysyncobj forks from its tick thread)."""
    out: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(x) for x in f.read().split()]
        except OSError:
            continue   # the thread ended meanwhile
    return out


def process_tree(pid: int) -> list[int]:
    """``pid`` and every process under it now: a meta node's projection writers are its zygote's children
    (meta/projection/writer_zygote.py), and their CPU is the node's work as much as its own threads' is."""
    return [pid, *(p for child in children(pid) for p in process_tree(child))]


def process_name(pid: int) -> str | None:
    """/proc/PID/comm: what meta/projection/writer_zygote.py names its zygote and writers."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return None


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of a process from /proc (seconds)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def log_warnings(c: BenchCluster, needles: tuple[str, ...] = ("\"level\": \"warning\"", "\"level\": \"error\"",
                                                                 "\"level\": \"critical\"", "Traceback")) -> dict[str, int]:
    """How many warning/error lines each node logged (evidence of trouble during a run)."""
    out = {}
    for n in c.nodes:
        try:
            with open(c.log_path(n), errors="replace") as f:
                out[n] = sum(1 for line in f if any(k in line for k in needles))
        except OSError:
            out[n] = -1
    return out


def log_tail(c: BenchCluster, node: str, lines: int = 5, needle: str = "") -> list[str]:
    try:
        with open(c.log_path(node), errors="replace") as f:
            got = [line.rstrip()[:400] for line in f if needle in line]
        return got[-lines:]
    except OSError:
        return []


class TermWatcher:
    """Polls every node's `GET /v1/cluster` a few times a second and records each change of term or leader,
    labelled with the benchmark phase running at the time: evidence of elections during load."""

    def __init__(self, s: aiohttp.ClientSession, c: BenchCluster, every_s: float = 0.25):
        self.s, self.c, self.every_s = s, c, every_s
        self.phase = "start"
        self.first_view: dict[str, Any] | None = None
        self.changes: list[dict[str, Any]] = []   # each later view that differs from the one before
        self._last: tuple | None = None
        self._t0 = time.perf_counter()
        self._task: asyncio.Task | None = None
        self._phase_terms: dict[str, list[int]] = {}

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            vs = await views(self.s, self.c)
            terms_ = {n: v["term"] for n, v in vs.items() if v}
            leaders = {n: v["leader"] for n, v in vs.items() if v}
            if terms_:
                top = max(terms_.values())
                lo_hi = self._phase_terms.setdefault(self.phase, [top, top])
                lo_hi[0], lo_hi[1] = min(lo_hi[0], top), max(lo_hi[1], top)
            key = (tuple(sorted(terms_.items())), tuple(sorted(leaders.items())))
            if key != self._last:
                view = {"t_s": round(time.perf_counter() - self._t0, 2), "phase": self.phase, "terms": terms_,
                        "leaders": leaders}
                if self._last is None:
                    self.first_view = view   # what the others change from: not a change itself
                else:
                    self.changes.append(view)
                self._last = key
            await asyncio.sleep(self.every_s)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def summary(self, max_changes: int = 40) -> dict[str, Any]:
        """Highest term seen at the start and end of each phase (a rise = elections), the first view, and the first
        changes from it (a node that stops or starts answering is a change too, with no election)."""
        return {"highest_term_first_last_by_phase": self._phase_terms, "first_view": self.first_view,
                "changes_seen": len(self.changes), "changes": self.changes[:max_changes]}
