"""The cost of handing an append from the broker's event loop to a thread and back: CPU per call.

    python -m ops.bench.storage_handoff [--calls 20000] [--concurrency 16]

Compares ``loop.run_in_executor`` on a ThreadPoolExecutor with broker/storage_threads.py, both on uvloop (the
broker's loop), with a call that does nothing: what is left is the hand-off alone. CPU is the whole process's
(loop and threads). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from concurrent.futures import ThreadPoolExecutor

from broker.storage_threads import StorageThreads
from runtime.event_loop import run as run_loop

THREADS = 16


def nothing(i: int) -> int:
    return i


async def per_call_us(calls: int, concurrency: int, hand_off) -> float:
    async def caller() -> None:
        for i in range(calls // concurrency):
            await hand_off(nothing, i)
    started = time.process_time()
    await asyncio.gather(*[caller() for _ in range(concurrency)])
    return round((time.process_time() - started) / (calls // concurrency * concurrency) * 1e6, 2)


async def measure(calls: int, concurrency: int) -> dict:
    loop = asyncio.get_running_loop()
    executor = ThreadPoolExecutor(THREADS)
    threads = StorageThreads(THREADS, "bench")
    try:
        return {"benchmark": "storage_handoff", "calls": calls, "concurrency": concurrency, "threads": THREADS,
                "cpu_us_per_call": {
                    "run_in_executor": await per_call_us(calls, concurrency,
                                                         lambda fn, *a: loop.run_in_executor(executor, fn, *a)),
                    "storage_threads": await per_call_us(calls, concurrency, threads.run)}}
    finally:
        executor.shutdown()
        threads.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=20_000)
    p.add_argument("--concurrency", type=int, default=16)
    a = p.parse_args()
    print(json.dumps(run_loop(measure(a.calls, a.concurrency))))


if __name__ == "__main__":
    main()
