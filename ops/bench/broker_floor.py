"""What the broker's send path costs with none of the broker in it: the floor under `broker_cpu_ms_per_batch`.

    python -m ops.bench.broker_floor [--seconds 8] [--generators 2] [--concurrency 16] [--queues 8]
                                     [--layers http,handoff,sync,syncfs]

Each layer is a stand-in server process on uvloop, driven by `broker_throughput`'s own generator processes with the
same POST of a binary batch of 100 x 1 KB over the same queues and connections, one layer after the other:

- ``http``: an aiohttp application with the broker's send route; the handler reads the body and answers the bytes
  of a send's answer for 100 offsets (made once). What aiohttp and uvloop cost per batch, nothing else.
- ``handoff``: as ``http``, and the body is written (``pwrite``) to its queue's file through
  ``broker/storage_threads.py`` under a per-queue ``asyncio.Lock``, as the broker's writer does, without a sync.
- ``sync``: as ``handoff``, with an ``fdatasync`` after each write: the storage floor of a durable send. A file is
  emptied when it passes FILE_BYTES_MAX, as a rolled and retained segment would be, so a long run fills no disk.
- ``syncfs``: the broker's group commit (``broker/group_commit.py``): the body is written on the event loop, and one
  ``syncfs`` of the file system covers every write made before it began, of every queue; a send is answered when a
  sync covered it. The rounds here are driven from the loop, the broker's by a thread of their own.

Prints one JSON object: per layer batches/s, messages/s and the server's CPU (utime + stime from /proc) per batch.
The broker's own figure (`broker_throughput`) less the ``syncfs`` layer (``sync`` with ``--sync-scope file``) is what
the broker's code adds: checks, routing, authentication, metrics, framing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor

from aiohttp import web

from ops import devcluster
from ops.bench import broker_throughput
from ops.bench.common import cpu_seconds, emit, free_base_port, loadavg, say

LAYERS = ("http", "handoff", "sync", "syncfs")
FILE_BYTES_MAX = 256 * 1024 * 1024
WRITER_THREADS = 16          # as broker/writes.py
READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
START_DELAY_S = 1.0
GENERATOR_SLACK_S = 60.0     # past its seconds, a generator's last requests finish well within this


def _answer(count: int) -> bytes:
    first = 10**9   # offsets of a long-lived queue are many digits long
    return b'{"queue":0,"offsets":[%s]}' % ",".join(str(first + i) for i in range(count)).encode()


def serve(layer: str, port: int) -> None:
    """The stand-in server of one layer (a process of its own); stops on SIGTERM and removes its files."""
    from broker.storage.files import sync_filesystem
    from broker.storage_threads import StorageThreads
    from runtime import event_loop

    answer = _answer(broker_throughput.BATCH)
    directory = tempfile.mkdtemp(prefix="stator-floor-")
    files: dict[str, list[int]] = {}   # queue -> [fd, position]
    locks: dict[str, asyncio.Lock] = {}
    threads = StorageThreads(WRITER_THREADS, "append")
    dir_fd = os.open(directory, os.O_RDONLY)
    unsynced: list[asyncio.Future] = []   # syncfs layer: sends written since the running round began
    rounds: list[asyncio.Task] = []       # the running round, if any

    async def sync_rounds() -> None:
        try:
            while unsynced:
                covered = unsynced[:]
                unsynced.clear()
                await threads.run(sync_filesystem, dir_fd)
                for future in covered:
                    if not future.done():
                        future.set_result(None)
        finally:
            rounds.clear()

    def append(state: list[int], raw: bytes) -> None:
        fd, pos = state
        if pos > FILE_BYTES_MAX:
            os.ftruncate(fd, 0)
            pos = 0
        state[1] = pos + os.pwrite(fd, raw, pos)
        if layer == "sync":
            os.fdatasync(fd)

    async def send(request: web.Request) -> web.Response:
        raw = await request.read()
        if layer != "http":
            queue = request.match_info["queue"]
            if queue not in files:
                files[queue] = [os.open(os.path.join(directory, queue), os.O_RDWR | os.O_CREAT, 0o644), 0]
                locks[queue] = asyncio.Lock()
            if layer == "syncfs":
                append(files[queue], raw)   # the page cache only, on the loop
                future = asyncio.get_running_loop().create_future()
                unsynced.append(future)
                if not rounds:
                    rounds.append(asyncio.create_task(sync_rounds()))
                await future
            else:
                async with locks[queue]:
                    await threads.run(append, files[queue], raw)
        return web.Response(body=answer, content_type="application/json")

    async def ready(request: web.Request) -> web.Response:
        return web.Response(text="ready")

    async def main() -> None:
        app = web.Application(client_max_size=32 * 1024 * 1024)
        app.router.add_post("/v1/messages/{topic}/{queue}", send)
        app.router.add_get("/readyz", ready)   # what devcluster.wait_ready asks
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port, backlog=1024).start()
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()
        await runner.cleanup()

    try:
        event_loop.run(main())
    finally:
        threads.stop()
        for fd, _ in files.values():
            os.close(fd)
        os.close(dir_fd)
        shutil.rmtree(directory, ignore_errors=True)


def _layer(pool: ProcessPoolExecutor, layer: str, args: argparse.Namespace) -> dict:
    port = free_base_port()
    proc = subprocess.Popen([sys.executable, "-m", "ops.bench.broker_floor", "--serve", layer, "--port", str(port)])
    url = f"http://127.0.0.1:{port}"
    try:
        devcluster.wait_ready([url], READY_TIMEOUT_S)
        work = [(url, i % args.queues) for i in range(args.concurrency)]
        shares = [work[g::args.generators] for g in range(args.generators)]
        start_at = time.time() + START_DELAY_S
        load = loadavg()
        cpu0, t0 = cpu_seconds(proc.pid), time.monotonic()
        # the stand-ins check no token and keep no topic: the generators send them anyway, as to a broker
        futures = [pool.submit(broker_throughput.generate, "produce", "unchecked", "floor", share, start_at,
                               args.seconds) for share in shares]
        results = [f.result(timeout=START_DELAY_S + args.seconds + GENERATOR_SLACK_S) for f in futures]
        cpu_s, wall_s = cpu_seconds(proc.pid) - cpu0, time.monotonic() - t0
    finally:
        devcluster.stop_process(proc, STOP_TIMEOUT_S)
    batches = sum(r["count"] for r in results) / broker_throughput.BATCH
    seconds = args.seconds
    out = {"layer": layer, "batches_per_s": round(batches / seconds),
           "messages_per_s": round(batches * broker_throughput.BATCH / seconds),
           "server_cpu_ms_per_batch": round(cpu_s * 1000 / batches, 3) if batches else None,
           # over the whole phase, the generators' start-up and START_DELAY_S included: a lower bound while loaded
           "server_cores": round(cpu_s / wall_s, 2),
           "generators_cores": round(sum(r["cpu_s"] for r in results) / seconds, 2), "loadavg": load}
    say(f"floor {layer}: {out['messages_per_s']} msg/s, {out['server_cpu_ms_per_batch']} ms of server CPU per batch")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--generators", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--queues", type=int, default=8)
    p.add_argument("--layers", default=",".join(LAYERS))
    p.add_argument("--serve", choices=LAYERS, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve:
        serve(args.serve, args.port)
        return
    layers = [x for x in args.layers.split(",") if x]
    unknown = sorted(set(layers) - set(LAYERS))
    if unknown:
        p.error(f"unknown layers {unknown}; known: {', '.join(LAYERS)}")
    with ProcessPoolExecutor(args.generators) as pool:
        results = [_layer(pool, layer, args) for layer in layers]
    emit({"benchmark": "broker_floor", "setup": {"seconds": args.seconds, "generators": args.generators,
                                                 "concurrency": args.concurrency, "queues": args.queues,
                                                 "batch": broker_throughput.BATCH,
                                                 "message_bytes": len(broker_throughput.BODY)},
          "layers": results})


if __name__ == "__main__":
    main()
