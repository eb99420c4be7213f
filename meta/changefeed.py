"""Wakes asyncio waiters when applied versions advance: per topic (long polls, watch streams) and for any change.

Published from the event loop only (the Raft tick thread hops here with call_soon_threadsafe). One future per key
per change: a change costs one wake-up per interested waiter, never a scan of all waiters.
"""

from __future__ import annotations

import asyncio

ANY = "*"


class ChangeFeed:
    def __init__(self) -> None:
        self.version = 0
        self._futures: dict[str, asyncio.Future] = {}

    def publish(self, version: int, changed: set[str] | None) -> None:
        """``changed=None`` means everything may have changed (a snapshot was installed)."""
        self.version = max(self.version, version)
        keys = list(self._futures) if changed is None else [ANY, *changed]
        for key in keys:
            fut = self._futures.pop(key, None)
            if fut is not None and not fut.done():
                fut.set_result(self.version)

    def _future(self, key: str) -> asyncio.Future:
        fut = self._futures.get(key)
        if fut is None or fut.done():
            fut = self._futures[key] = asyncio.get_running_loop().create_future()
        return fut

    async def wait(self, key: str, timeout_s: float) -> bool:
        """Wait for the next change of ``key`` (a topic or ANY). False on timeout."""
        try:
            await asyncio.wait_for(asyncio.shield(self._future(key)), timeout_s)
            return True
        except asyncio.TimeoutError:
            return False

    async def wait_version(self, version: int, timeout_s: float) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.version < version:
            left = deadline - loop.time()
            if left <= 0 or not await self.wait(ANY, left):
                return self.version >= version
        return True

    def close(self) -> None:
        for fut in self._futures.values():
            if not fut.done():
                fut.cancel()
        self._futures.clear()
