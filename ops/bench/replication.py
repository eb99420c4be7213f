"""Replicated produce: Stator topics of 1, 2 and 3 replicas against a NATS JetStream R3 stream, and the time to the
first acknowledged send after the leader of a queue (of the stream) is killed with SIGKILL.

    python -m ops.bench.replication [--seconds 10] [--generators 2] [--concurrency 16] [--failover-trials 5]
                                    [--skip-jetstream] [--skip-failover]

One Stator dev cluster (3 meta nodes, 3 brokers) and, unless ``--skip-jetstream``, three of Debian's ``nats-server``
(2.9) clustered with JetStream on 127.0.0.1 (ports below the ephemeral range, routes between the three, store dirs in
the run's temp dir) stay up for the whole run. The same ``--generators`` processes (one pool) drive both with
``broker_throughput``'s shape: batches of 100 messages of 1,000 bytes, closed loop, from ``--concurrency`` loops
spread over 8 queues (JetStream: subjects ``bench.0`` .. ``bench.7`` of one stream), for ``--seconds`` each (Stator:
each replicas value twice, in the order 1, 2, 3, 3, 2, 1, its figures over both passes: PASSES):

- Stator: one topic per replicas value R (1, 2, 3), created with ``{"queues": 8, "replicas": R, "min_insync":
  min(R, 2)}``. A meta node that does not know those fields (replication not landed) answers 400: the run says so,
  creates the topic without them, and marks that topic ``replication: "refused"`` (then the three measure the same
  thing). Sends are ``broker_throughput.generate``'s own processes, with a produce that follows the route: each send
  (one binary POST of the batch) goes to the queue's ``address`` in ``GET /v1/routes/{topic}``; after a refusal
  (409 NOT_LEADER, 503) or a failed connection, the producer long-polls the route (``after=`` the version it holds,
  ``wait=`` ROUTE_WAIT_S: at once when the route changed) and sends again.
- JetStream: one stream, file storage, 3 replicas; per batch, 100 ``publish_async`` then all 100 PubAcks awaited
  (nats-py, one connection per loop, each to a server of the client's own random pick). nats-server 2.9 has no
  ``sync_interval`` (its config refuses it): a PubAck means the message is in a quorum's page cache, not on disk.
  Stator's answer comes after its fsync.

Per side: msg/s, batch latency p50/p99/max (ms), the servers' CPU (the three brokers', the three nats-servers')
and the generators' as a share of one core; per Stator pass, ``storage``: the brokers' mean append of a batch (its
write on the leader to its copies' acknowledgement), mean sync of a group commit, syncs per batch, and, replicated,
the leader's mean wait for the copies after its own sync and a copy's mean time from the records' arrival to its
acknowledgement, from their /metrics (``broker_throughput._storage_figures``); ``ratio_r3_to_r1`` and ``ratio_stator_r3_to_jetstream`` (msg/s above 1
is better, p99 below 1). Then, unless ``--skip-failover``, ``--failover-trials`` trials per side under the same load
(on the R3 topic, on the stream): a probe in this process sends one batch (Stator) or one message (JetStream) every
PROBE_EVERY_S, each given PROBE_TIMEOUT_S; once the probe is acknowledged, the broker that heads queue 0 (the
stream's leader, from ``$JS.API.STREAM.INFO``) is killed with SIGKILL. The figure is the time from the kill to the
first acknowledgement of a probe sent after it (and, apart, from the last acknowledgement before it). A trial with no
such acknowledgement within FAILOVER_TIMEOUT_S reports null and why. The killed member is started again between
trials (Stator: what ``stator dev start --dir DIR NAME`` runs). Prints one JSON object; progress on stderr.

First, unless ``--no-fill-page-cache``, the page cache is filled with one synced file (ops/bench/page_cache.py), so
that every pass writes into reclaimed pages as a broker machine in steady state does, not into memory this VM's host
must back again page by page: without it, replicas=3 (three times the bytes) paid that far more than replicas=1,
and the ratio wandered 0.35-0.6 between runs of the same code. ``setup.page_cache_fill`` says what it wrote.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import aiohttp

from ops import devcluster
from ops.bench import broker_throughput as bt
from ops.bench import page_cache
from ops.bench.common import call, cpu_seconds, emit, free_base_port, free_port, loadavg, say, session
from wire import batch

REPLICAS = (1, 2, 3)
# Each replicas value is produced twice, in mirrored order, and its figures are those of both passes together. The
# machine's speed wanders within one run, and not always the same way: replicas=1 twice in a row for 25 s each made
# 270k then 210k msg/s, and 227k then 247k (the 2-core machine of issue 34, same code, brokers idle at 0.002 cores
# between passes). Measured once each in a fixed order, whichever value came first or last took all of it.
PASSES = (*REPLICAS, *reversed(REPLICAS))
QUEUES = 8
BROKERS = 3
WARMUP_S = 1.0                # each topic and the stream, before their phase (broker_throughput._prepare's second)
ROUTE_WAIT_S = 0.5            # a producer's long poll after a refusal: answered at once when the route changed
FOLLOW_WAIT_S = 5.0           # the failover probe's standing long poll on the route
SEND_TIMEOUT_S = 3.0          # one send of a generator (Stator), one batch's 100 PubAcks (JetStream), then retried:
                              # ~10x the worst batch p99 here, and short enough that the load goes on after a kill
STOP_CHECK_S = 0.2            # generators look for the stop file this often
PHASE_SLACK_S = 60.0          # a produce phase ends within its duration plus this, or the bench fails
PRE_KILL_S = 2.0              # the load runs this long before the kill
PRE_KILL_TIMEOUT_S = 30.0     # the probe must be acknowledged within this before a kill, or the trial is skipped
FAILOVER_TIMEOUT_S = 30.0     # a trial waits this long after the kill for an acknowledged probe
PROBE_EVERY_S = 0.05
PROBE_TIMEOUT_S = 2.0
PROBE_IN_FLIGHT_MAX = 10
RESTART_TIMEOUT_S = 90.0      # a killed member is up again within this (devcluster.start waits 60 s itself)
NATS_READY_TIMEOUT_S = 30.0
NATS_STOP_TIMEOUT_S = 10.0
NATS_SERVERS = ("n1", "n2", "n3")
STREAM = "bench"
INSTALL_HINT = "apt-get install -y nats-server"

# Set in every generator process (and in this one) by _init_process: the dev cluster whose meta nodes a
# route-following producer reads routes from, and the file whose presence ends the load early (a failover trial ends
# its load once the probe is back).
_CLUSTER_DIR = ""
_STOP_FILE = ""
_METAS: list[str] = []


def _init_process(cluster_dir: str, stop_file: str) -> None:
    """The pool's initializer. ``broker_throughput.generate`` calls its module's ``produce`` by name: pointing that
    at ``_produce`` keeps its processes, start time, CPU figure and answer, with sends that follow the route. The
    pool forks before the cluster is up (before this process has threads), so the meta URLs are read later."""
    global _CLUSTER_DIR, _STOP_FILE
    _CLUSTER_DIR, _STOP_FILE = cluster_dir, stop_file
    bt.produce = _produce


def _metas() -> list[str]:
    if not _METAS:
        _METAS.extend(m["url"] for m in devcluster.load(_CLUSTER_DIR)["meta"])
    return _METAS


def _stopped() -> bool:
    return bool(_STOP_FILE) and os.path.exists(_STOP_FILE)


def _running(deadline: float) -> Iterator[None]:
    """A generator's loop until ``deadline`` or the stop file, which it looks for at most every STOP_CHECK_S."""
    next_check = 0.0
    while (now := time.monotonic()) < deadline:
        if now >= next_check:
            if _stopped():
                return
            next_check = now + STOP_CHECK_S
        yield


# -- Stator: a producer that follows the route --------------------------------------------------------------------
class RouteFollower:
    """One queue's head as a producer sees it: ``address`` is where sends go (None while the route names no writable
    head). ``refresh`` is one read of ``GET /v1/routes/{topic}?after=V&wait=S``: answered at once with a newer route,
    else 304 after S."""

    def __init__(self, s: aiohttp.ClientSession, token: str, topic: str, queue: int, address: str | None = None):
        self.s, self.topic, self.queue = s, topic, queue
        self.headers = {"Authorization": f"Bearer {token}"}
        self.address, self.broker, self.writable = address, None, address is not None
        self.version = -1
        self._meta = 0

    async def refresh(self, wait_s: float) -> None:
        metas = _metas()
        meta = metas[self._meta % len(metas)]
        url = f"{meta}/v1/routes/{self.topic}"
        if self.version >= 0:   # no route held yet: a plain read (``after`` must be a version)
            url += f"?after={self.version}&wait={wait_s}"
        try:
            async with self.s.get(url, headers=self.headers,
                                  timeout=aiohttp.ClientTimeout(total=wait_s + SEND_TIMEOUT_S)) as r:
                if r.status == 200:
                    route = await r.json()
                    q = route["queues"][self.queue]
                    self.version, self.broker, self.writable = route["version"], q["broker"], q["writable"]
                    self.address = q["address"] if q["writable"] else None
                    return
                await r.read()
                if r.status == 304:
                    return
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError, ValueError, KeyError, IndexError):
            pass
        self._meta += 1   # that meta node did not answer: the next read asks another
        await asyncio.sleep(0.05)

    async def follow(self) -> None:
        """Keeps ``address`` current for as long as it runs (the failover probe's standing long poll)."""
        while True:
            await self.refresh(FOLLOW_WAIT_S)


def _payload() -> bytes:
    return batch.encode([batch.Message(None, None, bt.BODY.encode(), True)] * bt.BATCH)


async def _produce(s: aiohttp.ClientSession, url: str, token: str, topic: str, queue: int, deadline: float,
                   lat: list[float]) -> int:
    """``broker_throughput.produce`` (same arguments, same answer) that follows the route: ``url`` is the queue's
    broker when the load started; after any refusal or failed send it long-polls the route and sends again. Ends
    at ``deadline`` or when the stop file appears."""
    payload = _payload()
    headers = {"Authorization": f"Bearer {token}", "Content-Type": batch.CONTENT_TYPE}
    route = RouteFollower(s, token, topic, queue, url)
    timeout = aiohttp.ClientTimeout(total=SEND_TIMEOUT_S)
    sent = 0
    for _ in _running(deadline):
        if route.address is None:
            await route.refresh(ROUTE_WAIT_S)
            continue
        t = time.perf_counter()
        try:
            async with s.post(f"{route.address}/v1/messages/{topic}/{queue}", data=payload, headers=headers,
                              timeout=timeout) as r:
                await r.read()
                ok = r.status == 200
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError):
            ok = False
        if ok:
            lat.append((time.perf_counter() - t) * 1000)
            sent += bt.BATCH
        else:
            await route.refresh(ROUTE_WAIT_S)
    return sent


async def _create_topic(s: aiohttp.ClientSession, meta: str, admin: str, client: str, replicas: int) -> dict:
    """The topic ``r{replicas}``; falls back to a topic without the replication fields when meta refuses them."""
    name = f"r{replicas}"
    body = {"topic": name, "queues": QUEUES, "replicas": replicas, "min_insync": min(replicas, 2)}
    h_admin = {"Authorization": f"Bearer {admin}"}
    st, b = await call(s, "POST", f"{meta}/v1/topics", h_admin, body)
    info: dict[str, Any] = {"topic": name, "replicas": replicas, "min_insync": min(replicas, 2),
                            "replication": "accepted"}
    if st == 400:
        message = b.get("error", b) if isinstance(b, dict) else b
        say(f"stator: meta answered 400 to replicas/min_insync for {name} ({json.dumps(message)[:300]}): this meta "
            f"node does not take them (replication not landed?); {name} is created without them and is NOT "
            f"replicated, its figures are an unreplicated topic's")
        info.update(replication="refused", refusal=message)
        st, b = await call(s, "POST", f"{meta}/v1/topics", h_admin, {"topic": name, "queues": QUEUES})
    if st != 201:
        raise RuntimeError(f"create topic {name}: {st} {b}")
    st, detail = await call(s, "GET", f"{meta}/v1/topics/{name}?min_version={b['version']}", h_admin)
    if st == 200 and info["replication"] == "accepted" and "replicas" not in detail:
        # Taken without a 400 but not in the topic: a meta node that ignored the fields.
        info["replication"] = "ignored (not in GET /v1/topics/{topic})"
        say(f"stator: {name} was created, but its topic detail names no replicas: the fields were ignored")
    st, route = await call(s, "GET", f"{meta}/v1/routes/{name}?min_version={b['version']}",
                           {"Authorization": f"Bearer {client}"})
    if st != 200:
        raise RuntimeError(f"route of {name}: {st} {route}")
    info["owners"] = {q["queue"]: q["address"] for q in route["queues"]}
    info["brokers_heading"] = sorted({q["broker"] for q in route["queues"]})
    # Queue 0 as the route names it (its segments left out): the replicas it lists, when meta renders them.
    info["route_queue_0"] = {k: v for k, v in route["queues"][0].items() if k != "segments"}
    return info


async def _stator_prepare(meta: str, admin: str, client: str) -> dict[int, dict]:
    async with session() as s:
        topics = {r: await _create_topic(s, meta, admin, client, r) for r in REPLICAS}
        await asyncio.sleep(1.0)   # the brokers learn the routes and their budgets (broker_throughput._prepare)
        for info in topics.values():
            warm: list[float] = []
            deadline = time.monotonic() + WARMUP_S
            await asyncio.gather(*(_produce(s, url, client, info["topic"], q, deadline, warm)
                                   for q, url in info["owners"].items()))
            if not warm:
                raise RuntimeError(f"no send to {info['topic']} was acknowledged during its warm-up")
    return topics


def _stator_slots(info: dict, concurrency: int) -> list[tuple[str, int]]:
    return [(info["owners"][q], q) for q in (i % QUEUES for i in range(concurrency))]


# -- JetStream: the servers -----------------------------------------------------------------------------------------
def nats_binary() -> str | None:
    found = shutil.which("nats-server")
    if found:
        return found
    return "/usr/sbin/nats-server" if os.access("/usr/sbin/nats-server", os.X_OK) else None


def _nats_version(binary: str) -> str:
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout
        return out.strip().split()[-1] if out.strip() else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


class NatsCluster:
    """Three nats-server processes with JetStream, clustered over routes, each with a config, store dir and log in
    ``dir_``; ``kill`` and ``start`` act on one of them by name."""

    def __init__(self, binary: str, dir_: str):
        self.binary, self.dir = binary, dir_
        ports: list[int] = []
        while len(ports) < 3 * len(NATS_SERVERS):
            p = free_port()
            if p not in ports:
                ports.append(p)
        self.client_port = dict(zip(NATS_SERVERS, ports[0::3]))
        self.route_port = dict(zip(NATS_SERVERS, ports[1::3]))
        self.http_port = dict(zip(NATS_SERVERS, ports[2::3]))
        self.procs: dict[str, subprocess.Popen] = {}
        routes = ", ".join(f"nats-route://127.0.0.1:{self.route_port[n]}" for n in NATS_SERVERS)
        for n in NATS_SERVERS:
            with open(self._conf(n), "w") as f:
                f.write(f'server_name: {n}\nlisten: 127.0.0.1:{self.client_port[n]}\n'
                        f'http: 127.0.0.1:{self.http_port[n]}\n'
                        f'jetstream {{ store_dir: "{os.path.join(dir_, n)}" }}\n'
                        f'cluster {{ name: bench, listen: 127.0.0.1:{self.route_port[n]}, routes: [{routes}] }}\n')

    def _conf(self, n: str) -> str:
        return os.path.join(self.dir, f"{n}.conf")

    def _log(self, n: str) -> str:
        return os.path.join(self.dir, f"{n}.log")

    @property
    def urls(self) -> list[str]:
        return [f"nats://127.0.0.1:{self.client_port[n]}" for n in NATS_SERVERS]

    def name_of_port(self, port: int | None) -> str | None:
        return next((n for n, p in self.client_port.items() if p == port), None)

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs.values() if p.poll() is None]

    def start(self, n: str) -> None:
        log = open(self._log(n), "ab")
        try:
            self.procs[n] = subprocess.Popen([self.binary, "-c", self._conf(n)], stdin=subprocess.DEVNULL,
                                             stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                             cwd=self.dir)
        finally:
            log.close()

    def start_all(self) -> None:
        for n in NATS_SERVERS:
            self.start(n)
        self.wait_ready(NATS_SERVERS)
        say(f"nats: ready on ports {sorted(self.client_port.values())}, data in {self.dir}")

    def _jsz(self, n: str) -> dict | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port[n]}/jsz", timeout=1.0) as r:
                return json.loads(r.read())
        except (urllib.error.URLError, OSError, ValueError):
            return None

    def wait_ready(self, names) -> None:
        """Until each of ``names`` answers /jsz and names a JetStream meta leader; a server that exits fails it."""
        deadline = time.monotonic() + NATS_READY_TIMEOUT_S
        pending = list(names)
        while pending:
            for n in pending:
                if self.procs[n].poll() is not None:
                    raise RuntimeError(f"nats-server {n} exited with {self.procs[n].returncode}: {self._tail(n)}")
            pending = [n for n in pending if not ((self._jsz(n) or {}).get("meta_cluster") or {}).get("leader")]
            if not pending:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"nats-server {pending} not ready after {NATS_READY_TIMEOUT_S} s: "
                                   f"{self._tail(pending[0])}")
            time.sleep(0.1)

    def _tail(self, n: str) -> str:
        try:
            with open(self._log(n), errors="replace") as f:
                return " | ".join(line.strip() for line in f.readlines()[-3:])
        except OSError:
            return "(no log)"

    def kill(self, n: str) -> None:
        self.procs[n].send_signal(signal.SIGKILL)
        self.procs[n].wait(devcluster.KILL_TIMEOUT_S)

    def stop_all(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.terminate()   # all three at once: each flushes its store on the way out
        for p in self.procs.values():
            devcluster.stop_process(p, NATS_STOP_TIMEOUT_S)


# -- JetStream: the load --------------------------------------------------------------------------------------------
async def _nats_connect(servers: list[str]):
    import nats

    async def quiet(*_: Any) -> None:   # reconnects are expected (failover): no log line per event
        return None
    return await nats.connect(servers=servers, connect_timeout=2, reconnect_time_wait=0.05,
                              max_reconnect_attempts=-1, error_cb=quiet, disconnected_cb=quiet,
                              reconnected_cb=quiet, closed_cb=quiet)


async def _js_produce(nc, subject: str, deadline: float, lat: list[float]) -> int:
    """Closed loop on one connection: ``bt.BATCH`` publish_async, then all their PubAcks awaited (a batch counts only
    when every one of them is acknowledged, within SEND_TIMEOUT_S); latency per batch in ms."""
    import nats.errors
    js = nc.jetstream()
    body = bt.BODY.encode()
    sent = 0
    for _ in _running(deadline):
        t = time.perf_counter()
        futures: list[asyncio.Future] = []
        try:
            for _ in range(bt.BATCH):
                futures.append(await js.publish_async(subject, body))
            acks = await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), SEND_TIMEOUT_S)
            ok = not any(isinstance(a, BaseException) for a in acks)
        except (nats.errors.Error, asyncio.TimeoutError, OSError):
            ok = False
        if ok:
            lat.append((time.perf_counter() - t) * 1000)
            sent += bt.BATCH
        else:
            for f in futures:
                f.cancel()   # frees publish_async's pending slots; a late PubAck is dropped
            await asyncio.sleep(0.01)
    return sent


def _js_generate(servers: list[str], work: list, start_at: float, seconds: float) -> dict:
    """One generator process, JetStream's counterpart of broker_throughput.generate (same answer): ``work`` is
    (subject,) per loop, one connection each."""
    async def go() -> tuple[int, list[float]]:
        lat: list[float] = []
        conns = []
        try:
            for _ in work:
                conns.append(await _nats_connect(servers))
            await asyncio.sleep(max(0.0, start_at - time.time()))
            deadline = time.monotonic() + seconds
            counts = await asyncio.gather(*(_js_produce(nc, subject, deadline, lat)
                                            for nc, (subject,) in zip(conns, work)))
        finally:
            for nc in conns:
                await nc.close()
        return sum(counts), lat
    cpu0 = time.process_time()
    count, lat = asyncio.run(go())
    return {"count": count, "lat": lat, "cpu_s": time.process_time() - cpu0}


def _subject(q: int) -> str:
    return f"{STREAM}.{q}"


def _js_slots(concurrency: int) -> list[tuple[str]]:
    return [(_subject(i % QUEUES),) for i in range(concurrency)]


async def _js_prepare(nats_cluster: NatsCluster) -> dict:
    """The stream (file storage, 3 replicas; retried while the JetStream meta leader settles), then a warm-up."""
    import nats.errors
    from nats.js.api import StorageType, StreamConfig
    nc = await _nats_connect(nats_cluster.urls)
    try:
        js = nc.jetstream()
        config = StreamConfig(name=STREAM, subjects=[f"{STREAM}.*"], num_replicas=3, storage=StorageType.FILE)
        deadline = time.monotonic() + NATS_READY_TIMEOUT_S
        while True:
            try:
                await js.add_stream(config)
                break
            except (nats.errors.Error, asyncio.TimeoutError) as e:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"could not create the stream: {e!r}") from e
                await asyncio.sleep(0.2)
        await _js_wait_current(js, NATS_READY_TIMEOUT_S)
        warm: list[float] = []
        deadline = time.monotonic() + WARMUP_S
        await asyncio.gather(*(_js_produce(nc, subject, deadline, warm) for (subject,) in _js_slots(QUEUES)))
        if not warm:
            raise RuntimeError("no batch to the stream was acknowledged during its warm-up")
        info = await js.stream_info(STREAM)
        return {"leader": info.cluster.leader, "replicas": 1 + len(info.cluster.replicas or [])}
    finally:
        await nc.close()


async def _js_wait_current(js, timeout_s: float) -> bool:
    """Until the stream has a leader and both other replicas are current (True), or ``timeout_s`` (False)."""
    import nats.errors
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            info = await js.stream_info(STREAM)
            peers = info.cluster.replicas or []
            if info.cluster.leader and len(peers) == 2 and all(p.current for p in peers):
                return True
        except (nats.errors.Error, asyncio.TimeoutError):
            pass
        await asyncio.sleep(0.2)
    return False


# -- both sides: throughput -----------------------------------------------------------------------------------------
async def _phase(pool: ProcessPoolExecutor, submit: Callable[[list, float], Any], parts: list[list], seconds: float,
                 pids: list[int], keep_latencies: bool = False) -> dict:
    """One produce phase over ``parts`` (one per generator process), the figures of ``broker_throughput._phase``:
    ``submit(part, start_at)`` hands a generator its work. ``keep_latencies``: the batches' latencies too, under
    ``_latencies_ms`` (for _merged)."""
    start_at = time.time() + bt.START_DELAY_S
    futures = [asyncio.wrap_future(submit(part, start_at)) for part in parts]
    await asyncio.sleep(max(0.0, start_at - time.time()))
    cpu0, t0 = _cpu(pids), time.monotonic()
    results = await asyncio.wait_for(asyncio.gather(*futures), seconds + PHASE_SLACK_S)
    elapsed, cpu1 = time.monotonic() - t0, _cpu(pids)
    count = sum(r["count"] for r in results)
    server_s = cpu1 - cpu0 if cpu0 is not None and cpu1 is not None else None
    latencies = [x for r in results for x in r["lat"]]
    got = {"messages": count, "seconds": round(elapsed, 2), "messages_per_s": round(count / elapsed),
           "latency_ms": bt.percentiles(latencies),
           "cpu_cores": {"servers": round(server_s / elapsed, 2) if server_s is not None else None,
                         "generators": round(sum(r["cpu_s"] for r in results) / elapsed, 2)}}
    if keep_latencies:
        got["_latencies_ms"] = latencies
    return got


def _merged(passes: list[dict]) -> dict:
    """The passes of one replicas value as one phase: messages over seconds, percentiles over every batch, CPU
    weighted by time; each pass's own msg/s and latencies under ``passes``."""
    seconds = sum(p["seconds"] for p in passes)
    count = sum(p["messages"] for p in passes)

    def cores(side: str) -> float | None:
        shares = [p["cpu_cores"][side] for p in passes]
        return None if None in shares else round(sum(c * p["seconds"] for c, p in zip(shares, passes)) / seconds, 2)

    return {"messages": count, "seconds": round(seconds, 2), "messages_per_s": round(count / seconds),
            "latency_ms": bt.percentiles([x for p in passes for x in p["_latencies_ms"]]),
            "cpu_cores": {"servers": cores("servers"), "generators": cores("generators")},
            "passes": [{k: p[k] for k in ("messages_per_s", "latency_ms", "cpu_cores", "storage") if k in p}
                       for p in passes]}


def _cpu(pids: list[int]) -> float | None:
    seconds = [cpu_seconds(p) for p in pids]
    return None if not seconds or None in seconds else sum(seconds)


def _stator_submit(pool: ProcessPoolExecutor, client: str, topic: str, seconds: float):
    return lambda part, start_at: pool.submit(bt.generate, "produce", client, topic, part, start_at, seconds)


def _js_submit(pool: ProcessPoolExecutor, servers: list[str], seconds: float):
    return lambda part, start_at: pool.submit(_js_generate, servers, part, start_at, seconds)


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def _ratios(a: dict, b: dict) -> dict:
    return {"messages_per_s": _ratio(a["messages_per_s"], b["messages_per_s"]),
            "p50_ms": _ratio(a["latency_ms"]["p50"], b["latency_ms"]["p50"]),
            "p99_ms": _ratio(a["latency_ms"]["p99"], b["latency_ms"]["p99"])}


# -- both sides: failover -------------------------------------------------------------------------------------------
class Probe:
    """Starts ``send()`` every PROBE_EVERY_S (at most PROBE_IN_FLIGHT_MAX outstanding), each bounded by
    PROBE_TIMEOUT_S; keeps (sent, acknowledged, where) of each acknowledged one, in the order of their answers."""

    def __init__(self, send: Callable[[], Awaitable[str | None]]):
        self.send = send
        self.acks: list[tuple[float, float, str | None]] = []
        self.errors: collections.Counter[str] = collections.Counter()
        self._in_flight: set[asyncio.Task] = set()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            if len(self._in_flight) < PROBE_IN_FLIGHT_MAX:
                task = asyncio.create_task(self._one())
                self._in_flight.add(task)
                task.add_done_callback(self._in_flight.discard)
            await asyncio.sleep(PROBE_EVERY_S)

    async def _one(self) -> None:
        t = time.monotonic()
        try:
            where = await asyncio.wait_for(self.send(), PROBE_TIMEOUT_S)
        except asyncio.TimeoutError:
            self.errors["timeout"] += 1
        except Exception as e:  # noqa: BLE001 - any failed send is a refusal of the probe, counted by kind
            self.errors[str(e)[:80] if isinstance(e, Refused) else type(e).__name__] += 1
        else:
            self.acks.append((t, time.monotonic(), where))

    def first_after(self, t: float) -> tuple[float, float, str | None] | None:
        return next((a for a in self.acks if a[0] >= t), None)

    def last_ack_before(self, t: float) -> float | None:
        return max((a[1] for a in self.acks if a[1] < t), default=None)

    async def wait_after(self, t: float, timeout_s: float) -> tuple[float, float, str | None] | None:
        deadline = time.monotonic() + timeout_s
        while (got := self.first_after(t)) is None and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        return got

    async def stop(self) -> None:
        tasks = [t for t in (self._task, *self._in_flight) if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class Refused(Exception):
    pass


async def _trial(name: str, probe: Probe, load: list[asyncio.Future], find_victim: Callable[[], Awaitable[str]],
                 kill: Callable[[str], None], stop_file: str, describe: Callable[[], Awaitable[str]]) -> dict:
    """One failover trial with the load and probe already started: waits for the probe, kills the victim, waits for
    a probe sent after the kill to be acknowledged, then ends the load. The caller restarts the victim."""
    out: dict[str, Any] = {}
    started = time.monotonic()
    try:
        await asyncio.sleep(bt.START_DELAY_S + PRE_KILL_S)
        if await probe.wait_after(started, PRE_KILL_TIMEOUT_S) is None:
            out.update(recovery_s=None, victim=None,
                       reason=f"no probe acknowledged within {PRE_KILL_TIMEOUT_S:.0f} s before the kill "
                              f"({await describe()}; probe errors {dict(probe.errors)})")
            return out
        victim = await find_victim()
        out["victim"] = victim
        t_kill = time.monotonic()
        await asyncio.to_thread(kill, victim)
        say(f"{name}: killed {victim} (SIGKILL) in {(time.monotonic() - t_kill) * 1000:.0f} ms")
        errors_before = collections.Counter(probe.errors)
        got = await probe.wait_after(t_kill, FAILOVER_TIMEOUT_S)
        if got is None:
            out.update(recovery_s=None, reason=f"no probe sent after the kill was acknowledged within "
                                               f"{FAILOVER_TIMEOUT_S:.0f} s ({await describe()}; probe errors since "
                                               f"the kill {dict(probe.errors - errors_before)})")
        else:
            last = probe.last_ack_before(t_kill)
            out.update(recovery_s=round(got[1] - t_kill, 3), acknowledged_via=got[2],
                       since_last_ack_before_kill_s=round(got[1] - last, 3) if last is not None else None,
                       probe_errors_since_kill=dict(probe.errors - errors_before))
        return out
    finally:
        await probe.stop()
        with open(stop_file, "w"):
            pass
        results = await asyncio.wait_for(asyncio.gather(*load, return_exceptions=True), PHASE_SLACK_S)
        out["load_acknowledged_messages"] = sum(r["count"] for r in results if isinstance(r, dict))
        out["load_seconds"] = round(time.monotonic() - started, 1)
        os.remove(stop_file)


def _summary(trials: list[dict]) -> dict:
    ok = [t["recovery_s"] for t in trials if t.get("recovery_s") is not None]
    return {"recovery_s": {"median": round(statistics.median(ok), 3), "min": min(ok), "max": max(ok)} if ok else None,
            "recovered": len(ok), "trials_run": len(trials), "trials": trials}


async def _stator_failover(pool, args, cluster_dir: str, topic: str, owners: dict[int, str], client: str,
                           stop_file: str) -> dict:
    """``acknowledged_via``: the broker the first probe acknowledged after the kill was sent to (queue 0's head)."""
    trials: list[dict] = []
    load_s = bt.START_DELAY_S + PRE_KILL_S + PRE_KILL_TIMEOUT_S + FAILOVER_TIMEOUT_S + 10
    async with session() as s:
        for i in range(args.failover_trials):
            say(f"stator failover: trial {i + 1}/{args.failover_trials} (load {loadavg()})")
            # The queues' brokers at creation: the producers follow the route from there on.
            parts = bt._split([(owners[q], q) for q in (j % QUEUES for j in range(args.concurrency))],
                              args.generators)
            start_at = time.time() + bt.START_DELAY_S
            load = [asyncio.wrap_future(pool.submit(bt.generate, "produce", client, topic, part, start_at, load_s))
                    for part in parts]
            follower = RouteFollower(s, client, topic, 0)
            await follower.refresh(0)
            follow = asyncio.create_task(follower.follow())
            payload, headers = _payload(), {"Authorization": f"Bearer {client}", "Content-Type": batch.CONTENT_TYPE}

            async def send() -> str | None:
                address, broker = follower.address, follower.broker
                if address is None:
                    raise Refused("route: no writable head")
                async with s.post(f"{address}/v1/messages/{topic}/0", data=payload, headers=headers) as r:
                    raw = await r.read()
                    if r.status != 200:
                        raise Refused(f"{r.status} {_code(raw)}")
                return broker

            async def victim() -> str:
                await follower.refresh(0)
                return follower.broker

            async def describe() -> str:
                return f"queue 0 routed to {follower.broker}, writable {follower.writable}, version {follower.version}"

            probe = Probe(send)
            probe.start()
            try:
                trial = await _trial("stator", probe, load, victim,
                                     lambda b: devcluster.stop_member(cluster_dir, b, signal.SIGKILL), stop_file,
                                     describe)
            finally:
                follow.cancel()
                await asyncio.gather(follow, return_exceptions=True)
            trials.append(trial)
            say(f"  -> {trial.get('recovery_s')} s" + (f" ({trial['reason']})" if trial.get("reason") else ""))
            if trial.get("victim"):
                t0 = time.monotonic()
                try:   # what `stator dev start --dir DIR NAME` runs: waits until the broker is ready
                    await asyncio.wait_for(asyncio.to_thread(devcluster.start, cluster_dir, trial["victim"]),
                                           RESTART_TIMEOUT_S)
                except (devcluster.MemberFailed, asyncio.TimeoutError, RuntimeError) as e:
                    trial["restart_error"] = str(e)[:300] or type(e).__name__
                    say(f"stator failover: {trial['victim']} did not come back ({trial['restart_error']}); stopping")
                    break
                trial["restart_s"] = round(time.monotonic() - t0, 2)
    return _summary(trials)


def _code(raw: bytes) -> str:
    try:
        return json.loads(raw)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return ""


async def _js_failover(pool, args, nats_cluster: NatsCluster, stop_file: str) -> dict:
    """``acknowledged_via``: the server the probe was connected to when answered; ``leader_after``: the stream's."""
    import nats.errors as nats_errors
    trials: list[dict] = []
    load_s = bt.START_DELAY_S + PRE_KILL_S + PRE_KILL_TIMEOUT_S + FAILOVER_TIMEOUT_S + 10
    body = bt.BODY.encode()
    admin = await _nats_connect(nats_cluster.urls)
    try:
        admin_js = admin.jetstream()
        for i in range(args.failover_trials):
            say(f"jetstream failover: trial {i + 1}/{args.failover_trials} (load {loadavg()})")
            start_at = time.time() + bt.START_DELAY_S
            load = [asyncio.wrap_future(pool.submit(_js_generate, nats_cluster.urls, part, start_at, load_s))
                    for part in bt._split(_js_slots(args.concurrency), args.generators)]
            nc = await _nats_connect(nats_cluster.urls)
            js = nc.jetstream()
            at_kill: dict[str, Any] = {}

            async def send() -> str | None:
                await js.publish(_subject(0), body, timeout=PROBE_TIMEOUT_S)
                return nats_cluster.name_of_port(nc.connected_url.port if nc.connected_url else None)

            async def victim() -> str:
                info = await admin_js.stream_info(STREAM)   # $JS.API.STREAM.INFO
                at_kill["probe_server"] = nats_cluster.name_of_port(nc.connected_url.port if nc.connected_url
                                                                     else None)
                return info.cluster.leader

            async def describe() -> str:
                try:
                    info = await admin_js.stream_info(STREAM)
                    return f"stream leader {info.cluster.leader}"
                except Exception as e:  # noqa: BLE001 - only for the reason's text
                    return f"stream info: {type(e).__name__}"

            probe = Probe(send)
            probe.start()
            try:
                trial = await _trial("jetstream", probe, load, victim, nats_cluster.kill, stop_file, describe)
            finally:
                await nc.close()
            trial.update(at_kill)
            if trial.get("recovery_s") is not None:
                with contextlib.suppress(nats_errors.Error, asyncio.TimeoutError):
                    trial["leader_after"] = (await admin_js.stream_info(STREAM)).cluster.leader
            trials.append(trial)
            say(f"  -> {trial.get('recovery_s')} s" + (f" ({trial['reason']})" if trial.get("reason") else ""))
            if trial.get("victim"):
                t0 = time.monotonic()
                try:
                    nats_cluster.start(trial["victim"])
                    await asyncio.to_thread(nats_cluster.wait_ready, [trial["victim"]])
                except (RuntimeError, TimeoutError) as e:
                    trial["restart_error"] = str(e)[:300]
                    say(f"jetstream failover: {trial['victim']} did not come back ({e}); stopping")
                    break
                trial["restart_s"] = round(time.monotonic() - t0, 2)
                trial["replicas_current_after_restart"] = await _js_wait_current(admin_js, NATS_READY_TIMEOUT_S)
                trial["caught_up_s"] = round(time.monotonic() - t0, 2)
    finally:
        await admin.close()
    return _summary(trials)


# -- the run --------------------------------------------------------------------------------------------------------
async def _run(args: argparse.Namespace, tmp: str, binary: str | None, pool: ProcessPoolExecutor) -> dict:
    load0 = loadavg()
    stop_file, cluster_dir = os.path.join(tmp, "stop"), os.path.join(tmp, "c")
    nats_cluster: NatsCluster | None = None
    out: dict[str, Any] = {"benchmark": "replication"}
    try:
        if binary is not None:
            os.makedirs(os.path.join(tmp, "nats"))
            nats_cluster = NatsCluster(binary, os.path.join(tmp, "nats"))
            await asyncio.to_thread(nats_cluster.start_all)
        say(f"stator: starting 3 meta nodes and {BROKERS} brokers")
        cluster = await asyncio.to_thread(devcluster.up, cluster_dir, 3, BROKERS, free_base_port())
        admin, client = cluster["admin_token"], cluster["client_token"]
        broker_pids = [b["pid"] for b in cluster["brokers"]]
        _init_process(cluster_dir, stop_file)
        topics = await _stator_prepare(cluster["meta"][0]["url"], admin, client)
        stream = await _js_prepare(nats_cluster) if nats_cluster else None

        stator: dict[str, Any] = {}
        passes: dict[int, list[dict]] = {r: [] for r in REPLICAS}
        for r in PASSES:
            info = topics[r]
            say(f"stator: produce to {info['topic']} for {args.seconds} s, pass {len(passes[r]) + 1} of {PASSES.count(r)} "
                f"(load {loadavg()})")
            parts = bt._split(_stator_slots(info, args.concurrency), args.generators)
            broker_urls = [b["url"] for b in cluster["brokers"]]
            storage0 = await asyncio.to_thread(bt._append_figures, broker_urls)
            got = await _phase(pool, _stator_submit(pool, client, info["topic"], args.seconds), parts, args.seconds,
                               broker_pids, keep_latencies=True)
            # Where a send's time goes on the brokers: a batch's append on the leader (its write to the end of its
            # copies' acknowledgement) and one sync of a group commit, over the three brokers (leaders and copies)
            got["storage"] = bt._storage_figures(storage0, await asyncio.to_thread(bt._append_figures, broker_urls))
            passes[r].append(got)
            say(f"  -> {got['messages_per_s']} msg/s, p50 {got['latency_ms']['p50']} ms, "
                f"p99 {got['latency_ms']['p99']} ms")
        for r in REPLICAS:
            info = topics[r]
            stator[f"replicas_{r}"] = {**{k: v for k, v in info.items() if k != "owners"}, **_merged(passes[r])}
        out["stator"] = stator
        out["ratio_r3_to_r1"] = _ratios(stator["replicas_3"], stator["replicas_1"])
        if nats_cluster is not None:
            say(f"jetstream: produce to stream {STREAM} (R3) for {args.seconds} s (load {loadavg()})")
            parts = bt._split(_js_slots(args.concurrency), args.generators)
            got = await _phase(pool, _js_submit(pool, nats_cluster.urls, args.seconds), parts, args.seconds,
                               nats_cluster.pids())
            out["jetstream"] = {"stream": STREAM, "replicas": 3, "storage": "file", **(stream or {}), **got}
            out["ratio_stator_r3_to_jetstream"] = _ratios(stator["replicas_3"], out["jetstream"])
            say(f"  -> {got['messages_per_s']} msg/s, p50 {got['latency_ms']['p50']} ms, "
                f"p99 {got['latency_ms']['p99']} ms")
        if not args.skip_failover and args.failover_trials > 0:
            out["failover"] = {"stator": await _stator_failover(pool, args, cluster_dir, topics[3]["topic"],
                                                                topics[3]["owners"], client, stop_file)}
            if nats_cluster is not None:
                out["failover"]["jetstream"] = await _js_failover(pool, args, nats_cluster, stop_file)
    finally:
        with open(stop_file, "w"):   # any generator still running ends within STOP_CHECK_S
            pass
        try:
            if os.path.exists(os.path.join(cluster_dir, "cluster.json")):
                await asyncio.to_thread(devcluster.down, cluster_dir)
        finally:
            if nats_cluster is not None:
                await asyncio.to_thread(nats_cluster.stop_all)
    out["loadavg_start"], out["loadavg_end"] = load0, loadavg()
    return out


def run(args: argparse.Namespace, binary: str | None) -> dict:
    with tempfile.TemporaryDirectory(prefix="stator-bench-replication-") as tmp, contextlib.ExitStack() as stack:
        fill = None
        if not args.no_fill_page_cache:
            say(f"filling the page cache ({page_cache.fill_size_mib(tmp)} MiB; --no-fill-page-cache skips it)")
            fill = stack.enter_context(page_cache.filled(tmp))
            say(f"  -> {fill}")
        pool = ProcessPoolExecutor(max_workers=args.generators, initializer=_init_process,
                                   initargs=(os.path.join(tmp, "c"), os.path.join(tmp, "stop")))
        try:
            # The pool forks every generator at its first task: now, while this process has no thread yet.
            pool.submit(os.getpid).result(timeout=60)
            got = asyncio.run(_run(args, tmp, binary, pool))
        finally:
            pool.shutdown(wait=True, cancel_futures=True)   # _run's stop file ends any generator still going
    setup = {"message_bytes": len(bt.BODY), "batch": bt.BATCH, "seconds": args.seconds, "generators": args.generators,
             "concurrency": args.concurrency, "queues": QUEUES, "nproc": os.cpu_count(),
             "stator": f"3 meta nodes, {BROKERS} brokers (one dev cluster), one topic per replicas value with "
                       f"min_insync min(R, 2); binary sends of {bt.BATCH} to the route's address, fsync per batch",
             "failover": f"probe every {PROBE_EVERY_S * 1000:.0f} ms (timeout {PROBE_TIMEOUT_S} s), kill after "
                         f"{PRE_KILL_S} s of load, wait up to {FAILOVER_TIMEOUT_S} s; Stator kills the broker "
                         f"heading queue 0 of r3, JetStream the stream's leader"}
    setup["page_cache_fill"] = fill
    if binary is not None:
        setup["jetstream"] = (f"nats-server {_nats_version(binary)} x3, JetStream, one stream of 3 replicas, file "
                              f"storage, subjects {STREAM}.0..{QUEUES - 1}; per batch {bt.BATCH} publish_async then "
                              f"all PubAcks, nats-py, one connection per loop; no fsync before the PubAck "
                              f"(2.9 has no sync_interval)")
    return {"benchmark": got.pop("benchmark"), "setup": setup, **got}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=10.0, help="produce seconds per replicas value and for JetStream")
    p.add_argument("--generators", type=int, default=2, help="load generator processes, shared by both sides")
    p.add_argument("--concurrency", type=int, default=16, help="closed-loop producers, spread over 8 queues")
    p.add_argument("--failover-trials", type=int, default=5, help="kill -9 trials per side")
    p.add_argument("--skip-jetstream", action="store_true", help="Stator only: no nats-server needed")
    p.add_argument("--skip-failover", action="store_true")
    p.add_argument("--no-fill-page-cache", action="store_true",
                   help="measure with the page cache as it is (ops/bench/page_cache.py says why it is filled)")
    args = p.parse_args()
    if args.seconds <= 0 or args.generators < 1 or args.concurrency < 1 or args.failover_trials < 0:
        p.error("--seconds > 0, --generators >= 1, --concurrency >= 1, --failover-trials >= 0")
    binary = None
    if not args.skip_jetstream:
        binary = nats_binary()
        if binary is None:
            print(f"replication: nats-server is not installed; {INSTALL_HINT} (or --skip-jetstream)", file=sys.stderr)
            sys.exit(2)
        try:
            import nats  # noqa: F401
        except ImportError:
            print("replication: the nats-py client is missing; pip install -e '.[dev]' (or --skip-jetstream)",
                  file=sys.stderr)
            sys.exit(2)
    emit(run(args, binary))


if __name__ == "__main__":
    main()
