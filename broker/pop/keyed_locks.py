"""One asyncio lock per (group, topic, queue), kept only while a pop holds it or waits for it.

Group names are the client's to choose: a table of one lock per key ever named grows without bound (even past the
TOO_MANY_POP_QUEUES answer, since the lock was made before the state's bound was checked). Here an entry lives only
while it has users, so the table is never larger than the pops, acks and handovers in progress.

A pop that finds a queue busy (``busy``) leaves it to its holder, and the holder's release calls ``on_freed(key)``
so that the pops parked meanwhile look again (a parked pop used to wake only for new messages, and answered empty
while messages waited behind another pop's lock).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Hashable


class LockWaitExpired(Exception):
    """``hold``'s ``wait_s`` passed before the key's lock was free."""


class _Entry:
    __slots__ = ("lock", "users", "wanted")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0          # holding or waiting
        # Harmless mutant: None for False (only tested for truth).
        self.wanted = False     # another pop found it busy while it was held


class KeyedLocks:
    def __init__(self, on_freed: Callable[[Hashable], None]):
        self._entries: dict[Hashable, _Entry] = {}
        self._on_freed = on_freed

    def __len__(self) -> int:
        return len(self._entries)

    def busy(self, key: Hashable) -> bool:
        """Whether ``key`` is held; if so, its release will call ``on_freed(key)``."""
        entry = self._entries.get(key)
        if entry is None or not entry.lock.locked():
            return False
        entry.wanted = True
        return True

    @contextlib.asynccontextmanager
    async def hold(self, key: Hashable, wait_s: float | None = None) -> AsyncIterator[None]:
        """The key's lock, held for the block; LockWaitExpired when ``wait_s`` (None: no bound) passes first."""
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = _Entry()
        entry.users += 1
        try:
            try:
                async with asyncio.timeout(wait_s):
                    await entry.lock.acquire()
            except TimeoutError:
                raise LockWaitExpired(key) from None
            try:
                yield
            finally:
                entry.lock.release()
                if entry.wanted:
                    entry.wanted = False
                    self._on_freed(key)
        finally:
            entry.users -= 1
            if entry.users == 0:
                del self._entries[key]
