"""Broker sessions as the leader sees them (KRaft's BrokerHeartbeatManager): in memory, never in the log.

Heartbeats only refresh this table; a decision (fence, unfence, budget) is a command in the log. A node that becomes
leader starts every active broker's session afresh (grace), because it cannot know when the old leader last heard it.
"""

from __future__ import annotations

from collections.abc import Iterable


class SessionTracker:
    def __init__(self, timeout_ms: int):
        self.timeout_ms = timeout_ms
        self._last: dict[str, tuple[int, int]] = {}   # broker -> (epoch, monotonic ms of last heartbeat)
        self._wall: dict[str, int] = {}               # broker -> wall ms of last heartbeat (for display)

    def reset(self, active: Iterable[tuple[str, int]], now_ms: int) -> None:
        self._last = {b: (epoch, now_ms) for b, epoch in active}
        self._wall = {}

    def heartbeat(self, broker: str, epoch: int, now_ms: int, wall_ms: int) -> None:
        self._last[broker] = (epoch, now_ms)
        self._wall[broker] = wall_ms

    def expired(self, active: Iterable[tuple[str, int]], now_ms: int) -> list[tuple[str, int]]:
        """Active brokers whose current epoch has not been heard from within the timeout."""
        out = []
        for broker, epoch in active:
            seen = self._last.get(broker)
            if seen is None:
                self._last[broker] = (epoch, now_ms)  # first sight (e.g. just registered): its session starts now
            elif seen[0] != epoch:
                self._last[broker] = (epoch, now_ms)
            elif now_ms - seen[1] > self.timeout_ms:
                out.append((broker, epoch))
        return out

    def last_heartbeat_ms(self, broker: str) -> int | None:
        return self._wall.get(broker)
