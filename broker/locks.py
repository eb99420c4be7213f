"""Exclusive consumer locks as the broker enforces them (DESIGN.md invariants 4, 6 and 7).

Meta decides the locks; the broker only learns them from the ``group`` events of its all-topic watch stream (the
whole lock table of one group per event, a newer version replacing an older one) and fences every pull and commit of
an exclusive group with them: only the current token of a queue may read or commit it.

How the broker tells a stale token from a token it has not heard of yet: tokens come from one counter for the whole
cluster and grow with the log, and each event says up to which token its table is complete (``tokens_through``: the
counter when meta rendered the group's state). A token at or below that which is not the queue's current token is
therefore superseded (409 STALE_TOKEN); a larger one means the broker's copy of the group is behind the log, and it
waits a little for the stream to catch up (then 503 LOCKS_CATCHING_UP). The horizon is per group: the stream sends
each group's newest state in version order, so another group's newer table may arrive before this one's. Until the broker has followed the log
up to its registration it knows no group at all, so every request naming a group gets 503 LOCKS_CATCHING_UP.

Barriers (API.md "Route"): after a topic grew, an exclusive group reads a moved-to queue only once its committed
offset on the queue the slots came from has reached the split point, so every key keeps its order.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import structlog

from wire import group_event
from wire.errors import ApiError, rejection
from wire.waits import Changes

log = structlog.get_logger("broker.locks")

LOCK_CATCH_UP_WAIT_S = 2.0        # how long a request with a token newer than the broker's table waits for the stream
LOCK_WAITERS_MAX = 10_000         # requests waiting for the lock table at once; more are refused at once
PASSED_BARRIERS_MAX = 100_000     # (group, topic, queue, barrier) passes remembered; the oldest is checked again

LockEventError = group_event.GroupEventError   # a malformed ``group`` event: it changes nothing


@dataclass(frozen=True)
class GroupLocks:
    version: int
    mode: str | None
    locks: dict[str, list[int | None]]   # topic -> current token per queue (None: no owner)
    tokens_through: int                  # every grant with a token up to here is in ``locks`` (current or gone)


def parse_event(body: Any) -> tuple[str, GroupLocks]:
    """The group name and its lock table from a ``group`` event's data (wire/group_event.py), or LockEventError."""
    e = group_event.parse(body, group_event.LOCK_FIELDS)
    return e["group"], GroupLocks(e["version"], e["mode"], e["locks"], e["tokens_through"])


def stale_token(group: str, topic: str, queue: int, token: int | None) -> ApiError:
    return rejection(409, "STALE_TOKEN", "this token is not the current lock of the queue for this exclusive group"
                     if token is not None else "an exclusive group's pulls and commits need the queue's lock token",
                     group=group, topic=topic, queue=queue)


def catching_up(group: str, why: str) -> ApiError:
    return rejection(503, "LOCKS_CATCHING_UP", f"this broker's lock table is behind the log ({why}); retry shortly",
                     group=group)


class LockTable:
    """Per group: version, mode and current tokens, from meta's watch stream. ``ready()`` says whether the broker has
    followed the log up to its registration (before that, it cannot know which groups are exclusive)."""

    def __init__(self, ready: Callable[[], bool]):
        self._ready = ready
        self.groups: dict[str, GroupLocks] = {}
        self.max_token = 0                 # the largest token any event has carried: the broker's horizon
        self._changed = Changes()

    def apply(self, body: Any) -> bool:
        """Take one ``group`` event's data; False when it is not newer than what is held. Raises LockEventError
        (before changing anything) for a malformed one."""
        group, new = parse_event(body)
        old = self.groups.get(group)
        if old is not None and old.version >= new.version:
            return False
        self.groups[group] = new
        self.max_token = max(self.max_token, new.tokens_through)
        self._changed.changed()
        return True

    def exclusive(self, group: str) -> bool:
        g = self.groups.get(group)
        return g is not None and g.mode == "exclusive"

    def current(self, group: str, topic: str, queue: int) -> int | None:
        g = self.groups.get(group)
        tokens = g.locks.get(topic, []) if g is not None else []
        return tokens[queue] if queue < len(tokens) else None

    def _verdict(self, group: str, topic: str, queue: int, token: int | None) -> str:
        # A known group's own horizon, not the largest token seen anywhere: the stream may bring another group's
        # newer table before this group's (each key's newest state is sent, in version order), and a grant between
        # the two must read as "behind", not as stale. A group not known yet: any token it may have is unseen.
        # Any mode: a group's copy that says "no members yet" or "shared" may predate the grant that made it
        # exclusive, and a token past its horizon is exactly that grant (a shared group's horizon is meta's whole
        # counter, so a real token never exceeds it).
        g = self.groups.get(group)
        horizon = g.tokens_through if g is not None else self.max_token
        if token is not None and token > horizon:
            return "behind"   # harmless mutant: another word here (check() waits on any verdict but ok and stale)
        if not self.exclusive(group):
            return "ok"   # no locks to keep: a token at or below the horizon is ignored
        return "ok" if token is not None and token == self.current(group, topic, queue) else "stale"

    async def check(self, group: str, topic: str, queue: int, token: int | None) -> None:
        """Return if a pull or commit of ``group`` on (topic, queue) with ``token`` may go ahead; else raise
        409 STALE_TOKEN or 503 LOCKS_CATCHING_UP."""
        if not self._ready():
            raise catching_up(group, "it has not followed the log up to its registration yet")
        def granted() -> bool:
            verdict = self._verdict(group, topic, queue, token)
            if verdict == "stale":
                raise stale_token(group, topic, queue, token)
            return verdict == "ok"
        if not await self._changed.until(granted, LOCK_CATCH_UP_WAIT_S, LOCK_WAITERS_MAX):
            raise catching_up(group, f"token {token} is newer than every token it has seen")


Committed = Callable[[str, str, int], Awaitable[int]]   # (group, topic, queue) -> committed offset or -1
MinOffset = Callable[[str, int], Awaitable[int]]        # (topic, queue) -> the queue's min logic offset


class Barriers:
    """Whether an exclusive group's pull of a queue must wait for the group to pass a barrier on another queue."""

    def __init__(self, committed: Committed, min_offset: MinOffset):
        self._committed = committed
        self._min_offset = min_offset
        self._passed: OrderedDict[tuple, None] = OrderedDict()

    async def holding(self, group: str, route: dict[str, Any], queue: int) -> dict[str, Any] | None:
        """The first unpassed barrier of ``queue`` as ``{"queue": after_queue, "after_offset": X}``, or None."""
        topic = route["topic"]
        for b in route.get("barriers", ()):
            if b["queue"] != queue:
                continue
            held = {"queue": b["after_queue"], "after_offset": b["after_offset"]}
            if b["after_offset"] is None:
                return held   # undecided: the old queue's split point is not known yet
            key = (group, topic, queue, b["after_queue"], b["after_offset"])
            if key in self._passed:
                self._passed.move_to_end(key)
                continue
            if await self._position(group, topic, b["after_queue"]) < b["after_offset"]:
                return held
            # Harmless mutants: another value (an ordered set: only the keys are read); ``last=None`` (falsy, as False).
            self._passed[key] = None
            while len(self._passed) > PASSED_BARRIERS_MAX:
                self._passed.popitem(last=False)
        return None

    async def _position(self, group: str, topic: str, queue: int) -> int:
        """Where the group stands on a queue: its committed offset, or the queue's start if it never committed."""
        committed = await self._committed(group, topic, queue)
        return committed if committed >= 0 else await self._min_offset(topic, queue)
