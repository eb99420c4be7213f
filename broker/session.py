"""The broker's session with meta, as both the meta link (which keeps it) and the writers (which obey it) see it.

Session rule (DESIGN.md invariant 4): the broker counts its session from the *send* time of its last acknowledged
heartbeat; once that is older than the session timeout it refuses writes, before meta can have fenced it. After a
registration or an unfence it also refuses writes until its routes have reached the version of that answer: routes
older than the log's decision could still show a segment as writable that meta already sealed.
Budgets are what the log granted (DESIGN.md invariant 5), never more.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

SESSION_TIMEOUT_MS_DEFAULT = 9_000
HEARTBEAT_INTERVAL_MS_DEFAULT = 2_000


@dataclass
class MetaSession:
    epoch: int | None = None
    state: str = "unregistered"            # unregistered | active | fenced
    session_timeout_ms: int = SESSION_TIMEOUT_MS_DEFAULT
    heartbeat_interval_ms: int = HEARTBEAT_INTERVAL_MS_DEFAULT
    last_ack_sent: float = 0.0             # monotonic send time of the last acknowledged heartbeat
    routes_needed: int = 0                 # route version the broker must have seen before it writes again
    budget_grant: int = 0                  # meta's grant size: renew once less than half of it is left
    budgets: dict[str, int] = field(default_factory=dict)   # physical queue -> budget end granted in the log
    beat_requested: asyncio.Event = field(default_factory=asyncio.Event)

    def active(self) -> bool:
        return (self.state == "active" and self.epoch is not None
                and (time.monotonic() - self.last_ack_sent) * 1000 < self.session_timeout_ms)

    def writable(self, routes_version: int) -> bool:
        return self.active() and routes_version >= self.routes_needed

    def beat_soon(self) -> None:
        self.beat_requested.set()

    def renewal_due(self, budget_end: int, next_offset: int) -> bool:
        """Whether to ask for more budget now: the same half-a-grant rule meta applies when it grants."""
        return self.budget_grant > 0 and budget_end - next_offset < self.budget_grant // 2

    def forget(self, physical_queues: set[str]) -> None:
        """Drop what is kept about physical queues the routes no longer list."""
        for pq in physical_queues:
            self.budgets.pop(pq, None)
