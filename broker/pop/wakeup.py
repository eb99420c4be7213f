"""Per-topic wake-ups for long-polling pops: a send, a delivery coming due or an unblocked ordered queue wakes the
pops parked on that topic, which then look again."""

from __future__ import annotations

import asyncio


class TopicSignals:
    def __init__(self) -> None:
        self._events: dict[str, asyncio.Event] = {}

    def notify(self, topic: str) -> None:
        ev = self._events.pop(topic, None)
        if ev is not None:
            ev.set()

    async def wait(self, topic: str, timeout_s: float) -> None:
        """Returns after the next notify of ``topic`` or ``timeout_s``, whichever comes first."""
        ev = self._events.get(topic)
        if ev is None:
            ev = self._events[topic] = asyncio.Event()
        try:
            await asyncio.wait_for(ev.wait(), timeout_s)
        except asyncio.TimeoutError:
            pass
