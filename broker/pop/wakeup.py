"""Per-topic wake-ups for long-polling pops: a send, a delivery coming due or an unblocked ordered queue wakes the
pops parked on that topic, which then look again.

Each topic has a stamp: a pop reads it before it looks, and parks only if nothing was notified since, so a
notification that lands between its look and its park is never lost. A notification stamps its topic with the next
number of one sequence shared by every topic: a topic whose stamp was dropped (past TOPICS_TRACKED_MAX) and notified
again gets a number no stamp read before the drop can hold. (With a count per topic starting again at 1, a pop that
read 1, lost the stamp to 100,000 other topics' notifications while it looked, and then parked after a send made it
1 again, slept its whole wait with a message there.)
"""

from __future__ import annotations

import asyncio

from wire.waits import wait_set

TOPICS_TRACKED_MAX = 100_000   # stamps of topics nobody waits on are dropped beyond this


class TopicSignals:
    def __init__(self) -> None:
        self._events: dict[str, asyncio.Event] = {}
        self._stamps: dict[str, int] = {}
        self._sequence = 0          # notifications so far, of every topic

    def stamp(self, topic: str) -> int:
        return self._stamps.get(topic, 0)

    def notify(self, topic: str) -> None:
        if topic not in self._stamps and len(self._stamps) >= TOPICS_TRACKED_MAX:
            self._stamps = {t: n for t, n in self._stamps.items() if t in self._events}
        self._sequence += 1
        self._stamps[topic] = self._sequence
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
