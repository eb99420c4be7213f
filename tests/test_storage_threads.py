"""broker/storage_threads.py: the hand-off of storage calls from the event loop to threads and back."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from broker import storage_threads
from broker.storage_threads import StorageThreads


async def test_results_and_exceptions_reach_their_callers_in_order_of_completion():
    threads = StorageThreads(4, "t")
    try:
        assert await threads.run(lambda a, b: a + b, 2, 3) == 5
        with pytest.raises(KeyError, match="gone"):
            await threads.run(lambda: {}["gone"])
        results = await asyncio.gather(*[threads.run(lambda i=i: i * i) for i in range(50)])
        assert results == [i * i for i in range(50)]
    finally:
        threads.stop()


async def test_threads_start_as_calls_arrive_up_to_the_bound_and_stop_ends_them():
    threads = StorageThreads(3, "bounded")
    names = lambda: {t.name for t in threading.enumerate() if t.name.startswith("bounded-")}  # noqa: E731
    assert names() == set()   # none before the first call
    release = threading.Event()
    busy = [threads.run(release.wait, 10.0) for _ in range(5)]
    tasks = [asyncio.ensure_future(b) for b in busy]
    await asyncio.sleep(0.1)
    assert names() == {"bounded-0", "bounded-1", "bounded-2"}
    release.set()
    assert await asyncio.wait_for(asyncio.gather(*tasks), 10.0) == [True] * 5
    threads.stop()
    assert names() == set()
    with pytest.raises(RuntimeError, match="bounded threads stopped"):
        await threads.run(lambda: None)


async def test_a_caller_that_goes_away_leaves_the_threads_working():
    threads = StorageThreads(1, "cancel")
    started, release = threading.Event(), threading.Event()

    def slow() -> str:
        started.set()
        release.wait(10.0)
        return "done"
    try:
        task = asyncio.ensure_future(threads.run(slow))
        assert await asyncio.to_thread(started.wait, 10.0)
        task.cancel()
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await asyncio.wait_for(threads.run(lambda: "next"), 10.0) == "next"
    finally:
        threads.stop()


async def test_stop_waits_for_all_threads_together_at_most_its_timeout(monkeypatch):
    """A call stuck in the kernel (an fsync on a dying disk) must not hold a broker's shutdown for a timeout per
    thread: stop gives all of them STOP_TIMEOUT_S together, then returns."""
    monkeypatch.setattr(storage_threads, "STOP_TIMEOUT_S", 0.5)
    threads = StorageThreads(4, "stuck")
    release = threading.Event()
    tasks = [asyncio.ensure_future(threads.run(release.wait, 30.0)) for _ in range(4)]
    await asyncio.sleep(0.1)
    started = time.monotonic()
    threads.stop()
    took = time.monotonic() - started
    release.set()
    await asyncio.wait_for(asyncio.gather(*tasks), 10.0)
    assert took < 1.5, took   # four threads, each stuck: one timeout, not four
