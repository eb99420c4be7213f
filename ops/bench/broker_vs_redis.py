"""One Stator broker against Redis 7 streams, side by side in one run, with the same load processes.

    python -m ops.bench.broker_vs_redis [--duration 10] [--generators 2] [--size 1024] [--batch 100]

Starts Debian's ``redis-server`` (``appendonly yes``, ``appendfsync always``, its data dir in a temp dir, on
127.0.0.1 and a free port below the ephemeral range) and a Stator cluster the way ``broker_throughput`` does (three
meta nodes, one broker). Both stay up for the whole run. The same ``--generators`` processes (one pool) drive both,
with the same shape: ``--batch`` messages of ``--size`` bytes per batch, over QUEUES queues (Redis: one stream each)
from CONCURRENCY connections, closed loop, for ``--duration`` seconds each, Redis first:

- produce: Stator, ``broker_throughput``'s own produce (one ``POST`` of the batch, encoded once, fsync per batch);
  Redis, one pipeline (no MULTI) of ``--batch`` XADDs per batch on a redis-py asyncio connection (hiredis parses
  the replies), packed once per connection as Stator's payload is encoded once. With ``appendfsync always``
  Redis fsyncs its AOF once per event-loop turn, before it answers the commands read in that turn: a pipelined
  batch is acknowledged only once on disk, as a Stator batch is.
- consume: everything each side holds (its warm-up included) read back in pages of REDIS_PAGE: Stator with
  ``broker_throughput``'s pulls (``max`` = the page), Redis with XRANGE (COUNT = the page).

Per side and phase: messages, msg/s, latency per batch (pull or page on consume) p50/p99/max in ms, the server
process's CPU seconds (utime+stime from /proc over the phase, the generators' 1 s start wait included, idle for
both) and the generators' CPU as a share of one core; the counts each server stores before and after the produce
phase, with two checks (stored growth == acknowledged messages, consumed == stored); and Stator / Redis ratios
(above 1 is better for msg/s, below 1 for p99). Redis runs without RDB snapshots and without AOF rewrites: a
fork during a 10 s run would measure the rewrite, not the append path. Prints one JSON object; progress on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

from ops import devcluster
from ops.bench import broker_throughput as bt
from ops.bench.common import cpu_seconds, emit, free_base_port, free_port, loadavg, say

QUEUES = 8                  # broker_throughput's defaults: queues, and connections spread over them
CONCURRENCY = 16
REDIS_PAGE = 1000           # messages of one consume request: XRANGE's COUNT, a Stator pull's max
REDIS_READY_TIMEOUT_S = 30.0
REDIS_STOP_TIMEOUT_S = 10.0
REDIS_SOCKET_TIMEOUT_S = 30.0   # every redis-py call: connect, and each answer
PRODUCE_SLACK_S = 60.0          # a produce phase ends within its duration plus this, or the bench fails
CONSUME_TIMEOUT_S = 120.0       # a consume phase: this plus CONSUME_S_PER_PRODUCE_S per produced second
CONSUME_S_PER_PRODUCE_S = 20.0
WARMUP_S = 1.0                  # Redis's warm-up, as long as broker_throughput's (its _prepare)
INSTALL_HINT = "apt-get install -y redis-server (or, as root: bash ops/system-packages.sh)"


# -- Redis: the server ----------------------------------------------------------------------------------------------
def _redis_start(binary: str, dir_: str) -> tuple[subprocess.Popen, int]:
    port = free_port()
    argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", dir_, "--daemonize", "no",
            "--appendonly", "yes", "--appendfsync", "always", "--save", "", "--auto-aof-rewrite-percentage", "0",
            "--logfile", os.path.join(dir_, "redis.log")]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                            start_new_session=True, cwd=dir_)
    try:
        _redis_wait_ready(proc, port, dir_)
    except BaseException:
        devcluster.stop_process(proc, REDIS_STOP_TIMEOUT_S)
        raise
    say(f"redis: ready on 127.0.0.1:{port}, pid {proc.pid}, data in {dir_}")
    return proc, port


def _redis_wait_ready(proc: subprocess.Popen, port: int, dir_: str) -> None:
    import redis
    deadline = time.monotonic() + REDIS_READY_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"redis-server exited with {proc.returncode}: {_log_tail(dir_)}")
        try:
            with redis.Redis(port=port, socket_timeout=1.0, socket_connect_timeout=1.0) as r:
                if r.ping():
                    return
        except (redis.RedisError, OSError):
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"redis-server not ready after {REDIS_READY_TIMEOUT_S} s: {_log_tail(dir_)}")
        time.sleep(0.05)


def _log_tail(dir_: str) -> str:
    try:
        with open(os.path.join(dir_, "redis.log"), errors="replace") as f:
            return " | ".join(line.strip() for line in f.readlines()[-3:])
    except OSError:
        return "(no log)"


def _redis_version(binary: str) -> str:
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout
        return out.split()[2].removeprefix("v=") if out else "unknown"
    except (OSError, subprocess.SubprocessError, IndexError):
        return "unknown"


# -- Redis: the load ------------------------------------------------------------------------------------------------
def _client(port: int, connections: int):
    import redis.asyncio as aioredis
    return aioredis.Redis(host="127.0.0.1", port=port, max_connections=max(1, connections),
                          socket_timeout=REDIS_SOCKET_TIMEOUT_S, socket_connect_timeout=REDIS_SOCKET_TIMEOUT_S)


async def _redis_produce(port: int, key: str, deadline: float, lat: list[float], batch: int, body: bytes) -> int:
    """Closed loop on a connection of its own: one pipeline of ``batch`` XADDs (no MULTI) per batch until
    ``deadline``, then its ``batch`` replies; latency in ms. The pipeline is packed once, as broker_throughput
    encodes its payload once: per-batch packing in Python (redis-py's Pipeline) made the generators the limit."""
    import redis.asyncio as aioredis
    conn = aioredis.Connection(host="127.0.0.1", port=port, socket_timeout=REDIS_SOCKET_TIMEOUT_S,
                               socket_connect_timeout=REDIS_SOCKET_TIMEOUT_S)
    packed = conn.pack_commands([("XADD", key, "*", "body", body)] * batch)
    sent = 0
    try:
        await conn.connect()
        while time.monotonic() < deadline:
            t = time.perf_counter()
            await conn.send_packed_command(packed)
            for _ in range(batch):
                await conn.read_response()   # an error reply raises
            lat.append((time.perf_counter() - t) * 1000)
            sent += batch
    finally:
        await conn.disconnect()
    return sent


async def _redis_consume(r, key: str, end: int, lat: list[float]) -> int:
    """XRANGE pages of REDIS_PAGE from the start of the stream until ``end`` entries (or an empty page)."""
    got, start = 0, "-"
    while got < end:
        t = time.perf_counter()
        page = await r.xrange(key, min=start, max="+", count=REDIS_PAGE)
        lat.append((time.perf_counter() - t) * 1000)
        if not page:
            break
        got += len(page)
        start = "(" + page[-1][0].decode()
    return got


def _redis_generate(kind: str, port: int, work: list, start_at: float, seconds: float, batch: int,
                    size: int) -> dict:
    """One generator process, Redis's counterpart of broker_throughput.generate (same answer): ``work`` is
    (stream,) (produce: one connection each, for ``seconds`` from ``start_at`` wall time) or (stream, end)."""
    async def go() -> tuple[int, list[float]]:
        lat: list[float] = []
        r = _client(port, len(work))
        try:
            await asyncio.sleep(max(0.0, start_at - time.time()))
            if kind == "produce":
                deadline = time.monotonic() + seconds
                body = b"x" * size
                counts = await asyncio.gather(*(_redis_produce(port, key, deadline, lat, batch, body)
                                                for (key,) in work))
            else:
                counts = await asyncio.gather(*(_redis_consume(r, key, end, lat) for key, end in work))
        finally:
            await r.aclose()
        return sum(counts), lat
    cpu0 = time.process_time()
    count, lat = asyncio.run(go())
    return {"count": count, "lat": lat, "cpu_s": time.process_time() - cpu0}


def _redis_phase(pool: ProcessPoolExecutor, kind: str, port: int, work: list, args: argparse.Namespace,
                 pid: int, timeout_s: float) -> dict:
    """The same figures as broker_throughput._phase, for Redis."""
    start_at = time.time() + bt.START_DELAY_S
    futures = [pool.submit(_redis_generate, kind, port, part, start_at, args.duration, args.batch, args.size)
               for part in bt._split(work, args.generators)]
    time.sleep(max(0.0, start_at - time.time()))
    cpu0, t0 = cpu_seconds(pid), time.monotonic()
    results = [f.result(timeout=max(1.0, t0 + timeout_s - time.monotonic())) for f in futures]
    elapsed, cpu1 = time.monotonic() - t0, cpu_seconds(pid)
    count = sum(r["count"] for r in results)
    server_s = cpu1 - cpu0 if cpu0 is not None and cpu1 is not None else None
    return {"messages": count, "seconds": round(elapsed, 2), "messages_per_s": round(count / elapsed),
            "latency_ms": bt.percentiles([x for r in results for x in r["lat"]]),
            "cpu_cores": {"server": round(server_s / elapsed, 2) if server_s is not None else None,
                          "generators": round(sum(r["cpu_s"] for r in results) / elapsed, 2)}}


def _redis_lengths(port: int) -> dict[str, int]:
    async def go() -> dict[str, int]:
        r = _client(port, 1)
        try:
            return {key: await r.xlen(key) for key in _streams()}
        finally:
            await r.aclose()
    return asyncio.run(go())


def _redis_warm_up(port: int, args: argparse.Namespace) -> None:
    """As broker_throughput._prepare warms each queue up: one connection per stream for WARMUP_S."""
    async def go() -> None:
        deadline = time.monotonic() + WARMUP_S
        await asyncio.gather(*(_redis_produce(port, key, deadline, [], args.batch, b"x" * args.size)
                               for key in _streams()))
    asyncio.run(go())


def _hiredis() -> bool:
    from redis.utils import HIREDIS_AVAILABLE
    return bool(HIREDIS_AVAILABLE)


def _streams() -> list[str]:
    return [f"bench:{q}" for q in range(QUEUES)]


# -- both sides -----------------------------------------------------------------------------------------------------
def _use_shape(batch: int, size: int) -> None:
    """broker_throughput keeps its message shape in module constants (BATCH, BODY) that its produce, consume and
    _phase read when they run: set here in this process and, as the pool's initializer, in each generator."""
    bt.BATCH, bt.BODY, bt.PULL_MAX = batch, "x" * size, REDIS_PAGE


def _within(timeout_s: float, fn, *args):
    """``fn(*args)`` in a thread, given up after ``timeout_s`` (broker_throughput._phase waits without a bound)."""
    ex = ThreadPoolExecutor(1)
    try:
        return ex.submit(fn, *args).result(timeout=timeout_s)
    finally:
        ex.shutdown(wait=False)


def _with_cpu(pid: int, fn, *args) -> tuple[dict, float | None]:
    """``fn(*args)`` and the CPU seconds process ``pid`` spent meanwhile."""
    before = cpu_seconds(pid)
    got = fn(*args)
    after = cpu_seconds(pid)
    return got, (round(after - before, 2) if before is not None and after is not None else None)


def _side(produced: dict, produce_cpu: float | None, consumed: dict, consume_cpu: float | None,
          before: int, after: int) -> dict:
    return {"produce": {**produced, "server_cpu_s": produce_cpu},
            "consume": {**consumed, "server_cpu_s": consume_cpu},
            "stored_before_produce": before, "stored_after_produce": after,
            "checks": {"stored_growth_equals_produced": after - before == produced["messages"],
                       "consumed_equals_stored": consumed["messages"] == after}}


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def run(args: argparse.Namespace, binary: str) -> dict:
    _use_shape(args.batch, args.size)
    produce_timeout = args.duration + bt.START_DELAY_S + PRODUCE_SLACK_S
    consume_timeout = CONSUME_TIMEOUT_S + CONSUME_S_PER_PRODUCE_S * args.duration
    load0 = loadavg()
    with tempfile.TemporaryDirectory(prefix="stator-bench-vs-redis-") as tmp:
        os.makedirs(os.path.join(tmp, "redis"))
        redis_proc, port = _redis_start(binary, os.path.join(tmp, "redis"))
        cluster_dir = os.path.join(tmp, "c")
        pool = None
        try:
            say("stator: starting 3 meta nodes and 1 broker")
            cluster = devcluster.up(cluster_dir, 3, 1, free_base_port())
            meta, url, broker_pid = cluster["meta"][0]["url"], cluster["brokers"][0]["url"], cluster["brokers"][0]["pid"]
            admin, client = cluster["admin_token"], cluster["client_token"]
            owners = asyncio.run(bt._prepare(meta, admin, client, QUEUES))
            _redis_warm_up(port, args)
            pool = ProcessPoolExecutor(max_workers=args.generators, initializer=_use_shape,
                                       initargs=(args.batch, args.size))
            rpid = redis_proc.pid

            say(f"redis: produce for {args.duration} s (load {loadavg()})")
            r_before = _redis_lengths(port)
            slots = [(_streams()[i % QUEUES],) for i in range(CONCURRENCY)]
            r_prod, r_prod_cpu = _with_cpu(rpid, _redis_phase, pool, "produce", port, slots, args, rpid,
                                           produce_timeout)
            r_after = _redis_lengths(port)
            say(f"  -> {r_prod['messages_per_s']} msg/s; stator: produce (load {loadavg()})")
            s_before = asyncio.run(bt._ends(owners, client))
            slots = [(owners[q], q) for q in (i % QUEUES for i in range(CONCURRENCY))]
            s_prod, s_prod_cpu = _with_cpu(broker_pid, _within, produce_timeout, bt._phase, pool, "produce", [url],
                                           client, slots, args.generators, args.duration, [broker_pid])
            s_after = asyncio.run(bt._ends(owners, client))
            say(f"  -> {s_prod['messages_per_s']} msg/s; redis: consume (load {loadavg()})")
            r_cons, r_cons_cpu = _with_cpu(rpid, _redis_phase, pool, "consume", port, sorted(r_after.items()),
                                           args, rpid, consume_timeout)
            say(f"  -> {r_cons['messages_per_s']} msg/s; stator: consume (load {loadavg()})")
            reads = [(owners[q], q, end) for q, end in sorted(s_after.items())]
            s_cons, s_cons_cpu = _with_cpu(broker_pid, _within, consume_timeout, bt._phase, pool, "consume", [url],
                                           client, reads, args.generators, 0.0, [broker_pid])
            say(f"  -> {s_cons['messages_per_s']} msg/s")
        finally:
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)
            try:
                if os.path.exists(os.path.join(cluster_dir, "cluster.json")):
                    devcluster.down(cluster_dir)
            finally:
                devcluster.stop_process(redis_proc, REDIS_STOP_TIMEOUT_S)
    redis_side = _side(r_prod, r_prod_cpu, r_cons, r_cons_cpu, sum(r_before.values()), sum(r_after.values()))
    stator_side = _side(s_prod, s_prod_cpu, s_cons, s_cons_cpu, sum(s_before.values()), sum(s_after.values()))
    return {
        "benchmark": "broker_vs_redis",
        "setup": {"message_bytes": args.size, "batch": args.batch, "duration_s": args.duration,
                  "generators": args.generators, "queues": QUEUES, "connections": CONCURRENCY,
                  "redis": f"redis-server {_redis_version(binary)}, appendonly yes, appendfsync always, no RDB, "
                           f"no AOF rewrite; produce: one pipeline (no MULTI) of {args.batch} XADDs per batch, packed once "
                           f"per connection, redis-py asyncio, hiredis {'yes' if _hiredis() else 'no'}; "
                           f"consume: XRANGE pages of {REDIS_PAGE}",
                  "stator": f"1 broker, 3 meta nodes (broker_throughput's); produce: one POST of {args.batch} per "
                            f"batch, fsync per batch; consume: pulls of {REDIS_PAGE}",
                  "server_cpu_s": "utime+stime of the server process over the phase, the 1 s start wait included",
                  "nproc": os.cpu_count()},
        "redis": redis_side,
        "stator": stator_side,
        "ratio_stator_to_redis": {
            "produce_messages_per_s": _ratio(s_prod["messages_per_s"], r_prod["messages_per_s"]),
            "produce_p99_ms": _ratio(s_prod["latency_ms"]["p99"], r_prod["latency_ms"]["p99"]),
            "consume_messages_per_s": _ratio(s_cons["messages_per_s"], r_cons["messages_per_s"])},
        "loadavg_start": load0, "loadavg_end": loadavg(),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=float, default=10.0, help="produce seconds per side")
    p.add_argument("--generators", type=int, default=2, help="load generator processes, shared by both sides")
    p.add_argument("--size", type=int, default=1024, help="message bytes")
    p.add_argument("--batch", type=int, default=100, help="messages per batch")
    args = p.parse_args()
    if args.duration <= 0 or args.generators < 1 or args.size < 1 or args.batch < 1:
        p.error("--duration > 0, --generators >= 1, --size >= 1, --batch >= 1")
    binary = shutil.which("redis-server")
    if binary is None:
        print(f"broker_vs_redis: redis-server is not installed; {INSTALL_HINT}", file=sys.stderr)
        sys.exit(2)
    emit(run(args, binary))


if __name__ == "__main__":
    main()
