"""Latency fault avoidance, RocketMQ's ``MQFaultStrategy`` (DOMAIN.md, "Choosing a queue when producing"), recorded per
physical broker.

Each send's latency maps to a period during which its broker is avoided: latencies of at least
{50, 100, 550, 1800, 3000, 5000, 15000} ms give {0, 0, 2000, 5000, 6000, 10000, 30000} ms; a failed send counts as
10 s of latency. The newest measurement replaces the older one, so a fast send makes a broker available again at once.
RocketMQ records static-topic faults under the shared fake broker name, so one slow broker marks every logic queue slow;
here the key is the real broker that holds the queue's writable segment. The clock is injectable (milliseconds).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

LATENCY_MS_THRESHOLDS = (50, 100, 550, 1800, 3000, 5000, 15000)
AVOIDANCE_MS = (0, 0, 2000, 5000, 6000, 10000, 30000)
FAILED_SEND_LATENCY_MS = 10_000
BROKERS_TRACKED_MAX = 4096
assert len(LATENCY_MS_THRESHOLDS) == len(AVOIDANCE_MS)
assert list(LATENCY_MS_THRESHOLDS) == sorted(LATENCY_MS_THRESHOLDS)


def monotonic_ms() -> float:
    return time.monotonic() * 1000.0


def avoidance_ms(latency_ms: float) -> int:
    """How long to avoid a broker after a send that took ``latency_ms``."""
    for threshold, avoid in zip(reversed(LATENCY_MS_THRESHOLDS), reversed(AVOIDANCE_MS)):
        if latency_ms >= threshold:
            return avoid
    return 0


class LatencyFaultAvoidance:
    """Which brokers to avoid, and a queue picker that prefers queues on available brokers."""

    def __init__(self, *, enabled: bool = True, clock_ms: Callable[[], float] = monotonic_ms,
                 brokers_max: int = BROKERS_TRACKED_MAX):
        self.enabled = enabled
        self._clock_ms = clock_ms
        self._brokers_max = brokers_max
        self._items: OrderedDict[str, tuple[float, float]] = OrderedDict()  # broker -> (latency_ms, available_at_ms)

    def update(self, broker: str, latency_ms: float, *, failed: bool = False) -> None:
        """Record one send to ``broker``: its latency, or a failure (counted as 10 s)."""
        if not self.enabled:
            return
        latency = FAILED_SEND_LATENCY_MS if failed else latency_ms
        self._items[broker] = (latency, self._clock_ms() + avoidance_ms(latency))
        self._items.move_to_end(broker)
        while len(self._items) > self._brokers_max:
            self._items.popitem(last=False)

    def available_at_ms(self, broker: str) -> float:
        item = self._items.get(broker)
        return item[1] if item is not None and self.enabled else float("-inf")

    def is_available(self, broker: str) -> bool:
        return self._clock_ms() >= self.available_at_ms(broker)

    def latency_ms(self, broker: str) -> float | None:
        item = self._items.get(broker)
        return item[0] if item is not None else None

    def pick(self, queues: Sequence[Mapping[str, Any]], start: int, *, avoid_broker: str | None = None) -> int:
        """A queue id from a route's ``queues``, walking from position ``start``:
        1. a writable queue on an available broker other than ``avoid_broker`` (the one that just failed);
        2. else a writable queue not on ``avoid_broker``, the one whose broker becomes available first;
        3. else any writable queue; 4. else the queue at ``start`` (the send will meet the broker's answer).
        """
        n = len(queues)
        if n == 0:
            raise ValueError("the route has no queues")
        start %= n
        order = [queues[(start + i) % n] for i in range(n)]
        writable = [q for q in order if q.get("writable", True)]
        others = [q for q in writable if q.get("broker") != avoid_broker]
        for q in others:
            if self.is_available(q["broker"]):
                return q["queue"]
        if others:
            return min(others, key=lambda q: self.available_at_ms(q["broker"]))["queue"]
        if writable:
            return writable[0]["queue"]
        return order[0]["queue"]
