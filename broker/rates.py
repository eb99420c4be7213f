"""The last hour of a broker's traffic per topic, in one-minute buckets: messages stored (sends it led) and served
to pulls, the same counts as ``stator_broker_messages_in_total`` and ``_out_total``. The console draws a topic's
send and consume rates from them (issue 35), summed over the brokers: a cluster without Prometheus still shows its
last hour, and one with it has the same numbers there for longer.

Buckets are wall-clock minutes (``time.time() // 60``), so the brokers' buckets line up when the console sums them.
"""

from __future__ import annotations

import time
from collections.abc import Callable

MINUTES = 60             # buckets kept per topic: the last hour
TOPICS_MAX = 10_000      # topics with a history; a topic beyond is counted by Prometheus's counters only
STORED, SERVED = 1, 2    # a bucket is [minute, stored, served]


class MinuteCounts:
    def __init__(self, clock: Callable[[], float] = time.time):
        self._clock = clock
        self._topics: dict[str, list[list[int]]] = {}

    def add(self, topic: str, kind: int, count: int) -> None:
        """``count`` messages of ``kind`` (STORED or SERVED) for ``topic`` now."""
        buckets = self._topics.get(topic)
        if buckets is None:
            if len(self._topics) >= TOPICS_MAX:
                return
            buckets = self._topics[topic] = [[-1, 0, 0] for _ in range(MINUTES)]
        minute = int(self._clock() // 60)
        bucket = buckets[minute % MINUTES]
        if bucket[0] != minute:
            bucket[:] = [minute, 0, 0]
        bucket[kind] += count

    def last_hour(self, topic: str) -> dict[str, object]:
        """``{"minute_ms", "stored", "served"}``: the counts of the last MINUTES minutes, oldest first, ending with
        the minute now running, which starts at ``minute_ms`` (ms since the epoch)."""
        now = int(self._clock() // 60)
        buckets = self._topics.get(topic, [])
        by_minute = {b[0]: b for b in buckets}
        minutes = range(now - MINUTES + 1, now + 1)
        return {"minute_ms": now * 60_000,
                "stored": [by_minute[m][STORED] if m in by_minute else 0 for m in minutes],
                "served": [by_minute[m][SERVED] if m in by_minute else 0 for m in minutes]}
