"""Per-topic wake-ups for long-polling pops: a send, a delivery coming due or an unblocked ordered queue wakes the
pops parked on that topic, which then look again.

Each topic has a counter of notifications: a pop reads it before it looks, and parks only if nothing was notified
since, so a notification that lands between its look and its park is never lost.
"""

from __future__ import annotations

import asyncio

from wire.waits import wait_set

TOPICS_TRACKED_MAX = 100_000   # counters of topics nobody waits on are dropped beyond this


class TopicSignals:
    def __init__(self) -> None:
        self._events: dict[str, asyncio.Event] = {}
        self._counts: dict[str, int] = {}

    def stamp(self, topic: str) -> int:
        return self._counts.get(topic, 0)

    def notify(self, topic: str) -> None:
        if topic in self._counts or len(self._counts) < TOPICS_TRACKED_MAX:
            self._counts[topic] = self._counts.get(topic, 0) + 1
        else:
            self._counts = {t: n for t, n in self._counts.items() if t in self._events}
            self._counts[topic] = 1
        ev = self._events.pop(topic, None)
        if ev is not None:
            ev.set()

    async def wait(self, topic: str, stamp: int, timeout_s: float) -> None:
        """Returns after the first notify of ``topic`` since ``stamp`` (at once if there was one already) or after
        ``timeout_s``, whichever comes first."""
        if self.stamp(topic) != stamp:
            return
        ev = self._events.get(topic)
        if ev is None:
            ev = self._events[topic] = asyncio.Event()
        await wait_set(ev, timeout_s)
