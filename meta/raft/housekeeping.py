"""Upkeep that only reacts to time passing, run at most every ``HOUSEKEEPING_S`` instead of at every tick.

A node ticks at every message it reads (meta/raft/loop_ticker.py): two to three ticks a write on each node at one
writer, against a timer tick every 50 ms. Some of a tick's work only looks at the clock: pysyncobj's compaction check
(is a snapshot due, how is the writer doing) and the transport's dials and expiries. Done at every tick they cost a
lone writer ~2.5% of its writes a second (measured inside one cluster, each toggled every 0.5 s); every 5 ms is
still ten times finer than the timer tick, and far finer than any of the timeouts they watch (seconds).
"""

from __future__ import annotations

HOUSEKEEPING_S = 0.005


class Housekeeping:
    """Says when upkeep is due: at the first ask, then at the first ask ``period_s`` or more after the last time it
    was. ``now`` comes from the caller's clock (the simulator swaps each module's)."""

    __slots__ = ("period_s", "ran", "skipped", "_next")

    def __init__(self, period_s: float = HOUSEKEEPING_S):
        self.period_s = period_s
        self.ran = 0
        self.skipped = 0
        self._next = float("-inf")

    def due(self, now: float) -> bool:
        if now < self._next:
            self.skipped += 1
            return False
        self._next = now + self.period_s
        self.ran += 1
        return True
