"""The threads a broker's storage calls block in, handed work from the event loop: appends (write and fsync; with
group commit only an append that would wait, for a roll's syncs or its queue's lock) and reads (a queue's lock may be
held by an append's fsync).

The hand-off is on the produce and consume paths once per send and per local pull: ``loop.run_in_executor`` cost
26-29 us of CPU per call here (the executor's locks, semaphore and work item, a concurrent future chained to an
asyncio one), this one 7 us (a C queue and one ``call_soon_threadsafe``): ``python -m ops.bench.storage_handoff``.
The loop is the broker's limit (one core), so that is ~3% of a send of 100 x 1 KB and ~6% of a pull of 100.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from typing import Any, Callable

STOP_TIMEOUT_S = 10.0   # for all the threads: an fsync in progress finishes first


class StorageThreads:
    """Up to ``threads`` threads: one more is started with each call until there are that many (a broker that never
    appends starts no append thread). Calls are taken in the order given, each by whichever thread is free; a
    call's result or exception reaches its awaiting caller.

    ``driven``: no thread ever starts and each call runs inline on the caller's thread, for a caller that drives the
    broker on its own loop in one thread (ops/sim: its blocking calls complete at once on virtual time)."""

    def __init__(self, threads: int, name: str, driven: bool = False):
        self._driven = driven
        self._max = threads
        self._name = name
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._stopped = False

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        if self._stopped:
            raise RuntimeError(f"{self._name} threads stopped")
        if self._driven:
            return fn(*args)
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        if len(self._threads) < self._max:
            thread = threading.Thread(target=self._work, name=f"{self._name}-{len(self._threads)}", daemon=True)
            self._threads.append(thread)
            thread.start()
        self._calls.put((loop, future, fn, args))
        return await future

    def stop(self) -> None:
        """Lets every queued call finish, then ends the threads; waits STOP_TIMEOUT_S for all of them together."""
        self._stopped = True
        for _ in self._threads:
            self._calls.put(None)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _work(self) -> None:
        while True:
            call = self._calls.get()
            if call is None:
                return
            loop, future, fn, args = call
            try:
                result = fn(*args)
            except BaseException as e:  # noqa: BLE001 - the caller's to handle, whatever it is
                _settle(loop, future, None, e)
            else:
                _settle(loop, future, result, None)


def _settle(loop: asyncio.AbstractEventLoop, future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    try:
        loop.call_soon_threadsafe(_set, future, result, error)
    except RuntimeError:
        pass   # the loop is closed: nobody awaits the answer any more


def _set(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if future.done():
        return   # the caller went away (its request was cancelled); the call itself is done or failed
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
