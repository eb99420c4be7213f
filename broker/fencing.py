"""The one gate an exclusive group's reads and commits pass on this broker (DESIGN.md invariants 4, 6 and 7).

Every pull that names a group and every commit of a group's offset asks the gate, and nothing else, whether it may go
ahead; the handlers never read the lock table, the barriers or the routes themselves. The checks, in this order:

1. the token (``LockTable.check``): 503 LOCKS_CATCHING_UP until the broker has followed the log up to its
   registration or while its copy of the group is behind the token, 409 STALE_TOKEN for any token but the queue's
   current one of an exclusive group;
2. for a pull of an exclusive group only, the barriers of a grown topic (``Barriers.holding``): not a refusal but the
   barrier the pull waits behind (``held_by``), read from the route as it is after the token check.

Sends and pops name no lock token: what fences them is the broker's meta session (the writer's 503 FENCED, pop's 503
CATCHING_UP), checked where the queue's head is checked, after it.
"""

from __future__ import annotations

from typing import Any

from .locks import Barriers, LockTable
from .routing import RouteTable


class FencingGate:
    def __init__(self, locks: LockTable, barriers: Barriers, routes: RouteTable):
        self._locks = locks
        self._barriers = barriers
        self._routes = routes

    async def pull(self, group: str | None, topic: str, queue: int, token: int | None) -> dict[str, Any] | None:
        """Raise if ``group`` may not read (topic, queue) with ``token``; else the barrier the read is held by
        (``{"queue", "after_offset"}``) or None. A pull without a group is not fenced."""
        if group is None:
            return None
        await self._locks.check(group, topic, queue, token)
        route = self._routes.routes.get(topic)
        if self._locks.exclusive(group) and route is not None:
            return await self._barriers.holding(group, route, queue)
        return None

    async def commit(self, group: str, topic: str, queue: int, token: int | None) -> None:
        """Raise if ``group`` may not commit its offset of (topic, queue) with ``token``."""
        await self._locks.check(group, topic, queue, token)
