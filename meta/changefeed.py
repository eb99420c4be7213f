"""Wakes asyncio waiters when applied versions advance, and remembers recently changed topics in version order.

Published from the event loop only (the Raft tick hops here through meta/raft/node.py's LoopBridge). Waiters
are kept per key: a change costs one wake-up per interested waiter, never a scan of all waiters. Keys: a topic name, TOPICS (any
topic changed: all-topic watch streams) and ANY (any applied version: ``min_version`` reads, the projection).

The change log (``changed_since``) lets an all-topic watch stream look only at the topics that changed since it last
looked, instead of rescanning every topic on every applied command.

Waking is sliced: a publish wakes at most WAKE_SLICE waiters per loop pass. The tick hands a command's
changes and its proposer's answer to the loop in one batch, changes first; woken all at once, a thousand subscribers
ran before the write's own answer (its ack took as long as the whole fan-out). With slices the answer is queued
after the first slice or two, and the loop polls its sockets between slices.
"""

from __future__ import annotations

import asyncio
from collections import deque

ANY = "*"
TOPICS = "*topics"
CHANGE_LOG_ENTRIES_MAX = 100_000
WAKE_SLICE = 32   # waiters woken per loop pass: each then writes its answer (~45-60 µs of CPU), a slice ~2 ms


class ChangeFeed:
    def __init__(self, change_log_entries_max: int = CHANGE_LOG_ENTRIES_MAX) -> None:
        self.version = 0
        # Per key, in the order they began waiting (a dict, not a set: a set of futures iterates in address order,
        # and publish would wake them in an order that differs from run to run, which the simulator cannot replay)
        self._waiters: dict[str, dict[asyncio.Future, None]] = {}
        self._log: deque[tuple[int, str]] = deque(maxlen=change_log_entries_max)
        self._log_complete_after = 0   # every topic change with a version above this is in the log
        self._waking: deque[asyncio.Future] = deque()   # taken from _waiters by a publish, not woken yet
        self._wake_scheduled = False

    def publish(self, version: int, changed: set[str] | None) -> None:
        """``changed=None`` means everything may have changed (a snapshot was installed)."""
        self.version = max(self.version, version)
        if changed is None:
            self._log.clear()
            self._log_complete_after = self.version
            keys = list(self._waiters)
        else:
            for name in sorted(changed):
                if len(self._log) == self._log.maxlen:
                    # The oldest entry falls out: from now on the log is complete only after its version.
                    self._log_complete_after = max(self._log_complete_after, self._log[0][0])
                self._log.append((version, name))
            keys = [ANY, TOPICS, *sorted(changed)] if changed else [ANY]   # sorted: the same wake order every run
        for key in keys:
            self._waking.extend(self._waiters.pop(key, ()))
        if not self._wake_scheduled:
            self._wake_slice()

    def _wake_slice(self) -> None:
        self._wake_scheduled = False
        waking = self._waking
        for _ in range(min(len(waking), WAKE_SLICE)):
            fut = waking.popleft()
            if not fut.done():
                fut.set_result(True)
        if waking:
            waking[0].get_loop().call_soon(self._wake_slice)
            self._wake_scheduled = True

    def changed_since(self, version: int) -> set[str] | None:
        """Topics changed (or deleted) after ``version``; None when the log no longer reaches back that far."""
        if version < self._log_complete_after:
            return None
        out: set[str] = set()
        for v, name in reversed(self._log):
            if v <= version:
                break
            out.add(name)
        return out

    async def wait(self, key: str, timeout_s: float) -> bool:
        """Wait for the next change of ``key``. False on timeout.

        Each waiter owns a plain future and a timer: no shield or wait_for wrappers, which cost more than the
        wake-up itself when a thousand subscribers wait on one topic.
        """
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        waiters = self._waiters.get(key)
        if waiters is None:
            waiters = self._waiters[key] = {}
        waiters[fut] = None
        timer = loop.call_later(timeout_s, _expire, fut)
        try:
            return await fut
        finally:
            timer.cancel()
            waiters.pop(fut, None)
            if not waiters and self._waiters.get(key) is waiters:
                del self._waiters[key]

    async def wait_version(self, version: int, timeout_s: float) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.version < version:
            left = deadline - loop.time()
            if left <= 0 or not await self.wait(ANY, left):
                return self.version >= version
        return True

    def waiting(self) -> int:
        return sum(len(w) for w in self._waiters.values()) + len(self._waking)

    def close(self) -> None:
        for fut in [*self._waking, *(f for waiters in self._waiters.values() for f in waiters)]:
            if not fut.done():
                fut.cancel()
        self._waking.clear()
        self._waiters.clear()


def _expire(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(False)
