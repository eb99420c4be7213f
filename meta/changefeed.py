"""Wakes asyncio waiters when applied versions advance: per topic (long polls, watch streams) and for any change.

Published from the event loop only (the Raft tick thread hops here through raft_node.LoopBridge). Waiters are kept per
key: a change costs one wake-up per interested waiter, never a scan of all waiters.
"""

from __future__ import annotations

import asyncio

ANY = "*"


class ChangeFeed:
    def __init__(self) -> None:
        self.version = 0
        self._waiters: dict[str, set[asyncio.Future]] = {}

    def publish(self, version: int, changed: set[str] | None) -> None:
        """``changed=None`` means everything may have changed (a snapshot was installed)."""
        self.version = max(self.version, version)
        keys = list(self._waiters) if changed is None else [ANY, *changed]
        for key in keys:
            for fut in self._waiters.pop(key, ()):
                if not fut.done():
                    fut.set_result(True)

    async def wait(self, key: str, timeout_s: float) -> bool:
        """Wait for the next change of ``key`` (a topic or ANY). False on timeout.

        Each waiter owns a plain future and a timer: no shield or wait_for wrappers, which cost more than the
        wake-up itself when a thousand subscribers wait on one topic.
        """
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        waiters = self._waiters.get(key)
        if waiters is None:
            waiters = self._waiters[key] = set()
        waiters.add(fut)
        timer = loop.call_later(timeout_s, _expire, fut)
        try:
            return await fut
        finally:
            timer.cancel()
            waiters.discard(fut)
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
        return sum(len(w) for w in self._waiters.values())

    def close(self) -> None:
        for waiters in self._waiters.values():
            for fut in waiters:
                if not fut.done():
                    fut.cancel()
        self._waiters.clear()


def _expire(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(False)
