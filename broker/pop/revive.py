"""The revive scheduler: one background task per broker with a heap of delivery deadlines.

At a deadline it hands the delivery to ``fire(key, offset, seq)``, which decides (state.py ``expire``) whether it
comes due again or goes to the dead-letter queue; acked or superseded deliveries are skipped there (entries are
never removed from the heap, only outlived). The heap is rebuilt from the live deliveries when stale entries
outnumber them, so it stays proportional to the in-flight count.
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections.abc import Callable, Iterable

import structlog

from wire.waits import wait_set

from .state import Key

log = structlog.get_logger("broker.pop.revive")
IDLE_WAKE_S = 1.0


class Reviver:
    def __init__(self, fire: Callable[[Key, int, int], None], now_ms: Callable[[], int] | None = None):
        self._fire = fire
        self._now_ms = now_ms or (lambda: int(time.time() * 1000))
        self._heap: list[tuple[int, int, Key, int]] = []   # deadline_ms, seq, key, offset
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None

    def __len__(self) -> int:
        return len(self._heap)

    def schedule(self, deadline_ms: int, key: Key, offset: int, seq: int) -> None:
        # Harmless mutant: <= (a spurious wake-up: the loop works out its wait again).
        if self._heap and deadline_ms < self._heap[0][0]:
            self._wake.set()
        elif not self._heap:
            self._wake.set()
        heapq.heappush(self._heap, (deadline_ms, seq, key, offset))

    def rebuild(self, live: Iterable[tuple[int, int, Key, int]]) -> None:
        self._heap = list(live)
        heapq.heapify(self._heap)
        self._wake.set()

    def start(self) -> None:
        # Harmless mutants: the task's name (nothing looks a task up by name).
        self._task = asyncio.create_task(self._run(), name="pop-revive")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def due(self, now_ms: int) -> list[tuple[int, int, Key, int]]:
        out = []
        while self._heap and self._heap[0][0] <= now_ms:
            out.append(heapq.heappop(self._heap))
        return out

    async def _run(self) -> None:
        while True:
            now = self._now_ms()
            for deadline, seq, key, offset in self.due(now):
                try:
                    self._fire(key, offset, seq)
                except Exception:
                    log.exception("pop_revive_failed", key=key, offset=offset)
            # Harmless mutant: / 1001 (a wait 0.1% short: the loop looks again and waits the rest).
            wait_s = IDLE_WAKE_S if not self._heap else min(IDLE_WAKE_S, max(0.0, (self._heap[0][0] - now) / 1000))
            self._wake.clear()
            await wait_set(self._wake, wait_s)
