"""Bounded counts of concurrent waiters (long polls, watch streams), each mirrored in a gauge."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

from wire.errors import rejection


class Admission:
    """At most ``limit`` concurrent waiters of one kind; one more is a 503 TOO_MANY_WAITERS, counted by name."""

    def __init__(self, name: str, limit: int, gauge: Gauge, rejections: Counter, message: str):
        self.name = name
        self.limit = limit
        self.count = 0
        self._gauge = gauge
        self._rejections = rejections
        self._message = message

    def enter(self) -> None:
        if self.count >= self.limit:
            self._rejections.labels(self.name).inc()
            raise rejection(503, "TOO_MANY_WAITERS", self._message, limit=self.limit)
        self.count += 1
        self._gauge.set(self.count)

    def leave(self) -> None:
        self.count -= 1
        self._gauge.set(self.count)
