"""The leader's side of a replicated head: what each follower holds, when a send may be acknowledged, what consumers
may read, and who should be in sync (DESIGN.md invariant 12).

- A follower's fetch names the offset it holds durably (``fetched``): that is its acknowledgement.
- A send is acknowledged once every broker the leader waits for holds its records (``replicated``). The leader waits
  for the in-sync set of its route and for every follower it has asked meta to add: a copy counts from the moment
  the leader asks, so an acknowledged record is on every copy the log may name in sync, whatever the log decides.
  A follower leaves the wait only when the route (the log) says it left the in-sync set.
- Consumers read up to the high watermark (``readable_end``): what every copy waited for holds, so a failover can
  never take back a record a consumer saw.
- Every MAINTAIN_S the leader asks meta (``AlterInSync``, fenced by the gen it leads) to remove a follower that has
  not caught up for LAG_MAX_S, and to add one that has (Kafka's replica.lag.time.max.ms and AlterPartition).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

import structlog

from wire.errors import ApiError, rejection

from ..routing import RouteTable, Segment
from ..storage import Run

log = structlog.get_logger("broker.replication")

LAG_MAX_S = 10.0              # a follower that has not caught up for this long leaves the in-sync set
MAINTAIN_S = 0.5              # how often the leader looks at its followers
REPLICATION_WAIT_S = 30.0     # a send waits at most this long for its copies (the lag bound frees it well before)


class QueueRef(NamedTuple):
    """A queue named without a segment: one whose head moved away from here."""
    topic: str
    queue: int


def unconfirmed(seg: Segment | QueueRef, why: str, what: str = "the records are") -> ApiError:
    """After the append: the records (or a commit, a pop ack: ``what``) are stored here, but the copies did not
    confirm them; a failover may keep them or not. Not NOT_ENOUGH_REPLICAS, which says nothing was stored: a sender
    must count this one as in doubt (an idempotent producer's resend is stored once)."""
    return rejection(503, "REPLICATION_UNCONFIRMED", f"{why}: {what} stored on the leader but not confirmed by its "
                     "copies; a failover may keep it or not: send again", topic=seg.topic, queue=seg.queue)


def not_enough_replicas(seg: Segment, in_sync: int, min_insync: int, why: str) -> ApiError:
    return rejection(503, "NOT_ENOUGH_REPLICAS", f"{why}: {in_sync} of the queue's copies are in sync and the topic "
                     f"needs {min_insync}; retry shortly", topic=seg.topic, queue=seg.queue, in_sync=in_sync,
                     min_insync=min_insync)


class ReplicaTracker:
    def __init__(self, me: str, routes: RouteTable, local_end: Callable[[Segment], int]):
        self.me = me
        self.routes = routes
        self._local_end = local_end                              # the leader's own durable end of a segment
        self._acked: dict[str, dict[str, int]] = {}              # pq -> follower -> offset it holds durably
        self._caught_up: dict[str, dict[str, float]] = {}        # pq -> follower -> monotonic time it last caught up
        self._end_at_fetch: dict[str, dict[str, int]] = {}       # pq -> follower -> leader's end at its last fetch
        self._adding: dict[str, set[str]] = {}                   # pq -> followers asked to be added, not yet in sync
        self._hw: dict[str, int] = {}                            # pq -> high watermark (physical), only grows
        self._epochs: dict[str, int] = {}                        # follower -> registration its fetches came from
        self._waiters: dict[str, list[tuple[int, asyncio.Future]]] = {}
        self.on_written: Callable[[str, Run], None] = lambda pq, run: None   # each append (FetchSource.written)
        # Whether a copy holds what else the leader keeps for the head (its committed offsets: offsets.py), asked
        # before the leader waits for it
        self.copy_ready: Callable[[Segment, str], bool] = lambda seg, copy: True
        # A follower registered again (a new disk, or a restart): what the leader knew of its copies is void
        self.on_new_follower_epoch: Callable[[str], None] = lambda follower: None

    # -- who counts ---------------------------------------------------------------------------------------------
    def waited_for(self, seg: Segment) -> set[str]:
        """The copies a write to ``seg`` waits for (never this broker)."""
        return (set(seg.in_sync) | self._adding.get(seg.physical_queue, set())) - {self.me}

    def _followers_end(self, seg: Segment) -> int | None:
        """The offset every follower waited for holds; None when the leader waits for nobody."""
        acked = self._acked.get(seg.physical_queue, {})
        waited = self.waited_for(seg)
        return min(acked.get(f, seg.physical_start) for f in waited) if waited else None

    def readable_end(self, seg: Segment) -> int:
        """The high watermark of a segment this broker leads: consumers read below it (physical, exclusive)."""
        local = self._local_end(seg)
        followers = self._followers_end(seg)
        if followers is None:
            return local
        hw = max(self._hw.get(seg.physical_queue, seg.physical_start), min(local, followers))
        self._hw[seg.physical_queue] = hw
        return min(hw, local)

    # -- sends --------------------------------------------------------------------------------------------------
    def check_writable(self, seg: Segment, what: str = "the send") -> None:
        """Before an append (a commit, a pop ack: ``what``): refuse when fewer copies than the topic's min_insync
        are in sync."""
        need = self.routes.min_insync(seg.topic)
        if len(seg.in_sync) < need:
            raise not_enough_replicas(seg, len(seg.in_sync), need, f"{what} is refused")

    async def replicated(self, seg: Segment, end: int) -> None:
        """Returns once every follower waited for holds the segment's records below ``end``; 503
        REPLICATION_UNCONFIRMED when that took longer than REPLICATION_WAIT_S, when the copies in sync fell below
        min_insync meanwhile, or when another copy was elected (the records are stored but not acknowledged: Kafka's
        NOT_ENOUGH_REPLICAS_AFTER_APPEND)."""
        pq = seg.physical_queue
        if self._reached(seg, end):
            return self._still_enough(pq, seg)
        future = asyncio.get_running_loop().create_future()
        waiters = self._waiters.setdefault(pq, [])
        waiters.append((end, future))
        try:
            await asyncio.wait_for(future, REPLICATION_WAIT_S)
        except asyncio.TimeoutError:
            raise unconfirmed(seg, f"the copies did not take them within {REPLICATION_WAIT_S:.0f} s") from None
        finally:
            if not future.done():
                future.cancel()
            if (end, future) in waiters:
                waiters.remove((end, future))
            if not waiters and self._waiters.get(pq) is waiters:
                del self._waiters[pq]
        self._still_enough(pq, seg)

    def _reached(self, seg: Segment, end: int) -> bool:
        followers = self._followers_end(seg)
        return followers is None or followers >= end

    def _still_enough(self, pq: str, seg: Segment) -> None:
        now = self.routes.held(pq) or seg
        if (now.sealer or now.broker) != self.me:   # a failover: another copy's end is the segment's end
            raise unconfirmed(seg, "another copy was elected to lead meanwhile")
        self.still_enough(now)

    def still_enough(self, seg: Segment, what: str = "the records are") -> None:
        """What was stored while ``seg``'s copies in sync were waited for (records, a commit, pop state: ``what``),
        once they are as ``seg`` names them now: 503 REPLICATION_UNCONFIRMED when they fell below min_insync, a
        copy waited for having left the set. Answered ok, it stood on fewer disks than the topic asks (the chaos
        runner, seed 49: b1 answered pop acks ok once a fence took b3, dead, out of the set, on b1's disk alone)."""
        need = self.routes.min_insync(seg.topic)
        if len(seg.in_sync) < need:
            raise unconfirmed(seg, f"{len(seg.in_sync)} copies are in sync and the topic needs {need}", what)

    def _settle(self, pq: str) -> None:
        waiters = self._waiters.get(pq)
        if not waiters:
            return
        seg = self.routes.held(pq)
        if seg is None or (seg.sealer or seg.broker) != self.me:
            for _, f in waiters:   # led by another broker now: _still_enough answers each
                if not f.done():
                    f.set_result(None)
            return
        for end, f in waiters:
            if not f.done() and self._reached(seg, end):
                f.set_result(None)

    def route_changed(self) -> None:
        """The routes moved on: the in-sync sets waited for may have shrunk, or a head moved away."""
        for pq in list(self._waiters):
            self._settle(pq)
        # What is kept of a segment the routes no longer give this broker goes (a remap, a deleted topic): the
        # tables hold only the heads it leads now
        for pq in {*self._acked, *self._caught_up, *self._adding, *self._hw}:
            if pq not in self.routes.hosted:
                self._forget(pq)
        for pq, adding in self._adding.items():
            adding -= set(self.routes.hosted[pq].in_sync)

    # -- fetches ------------------------------------------------------------------------------------------------
    def fetched(self, seg: Segment, follower: str, offset: int, epoch: int, now: float | None = None) -> None:
        """A follower of a segment this broker leads fetched from ``offset``: it holds everything below durably.
        ``epoch``: its registration with meta; a new one voids what was known of every copy it holds (Kafka's
        KIP-903: an addition to the in-sync set names it, and meta refuses one that is not the broker's current).
        ``now``: the monotonic time of the fetch (the clock's, unless a test names it)."""
        if follower == self.me or follower not in seg.replicas:
            return
        if self._epochs.get(follower) != epoch:
            self._new_epoch(follower, epoch)
        pq = seg.physical_queue
        self._acked.setdefault(pq, {})[follower] = offset
        # Caught up when it holds what the leader held at its previous fetch (Kafka's lastCaughtUpTime): under a
        # steady load the leader always holds more than any follower at the moment it asks.
        ends = self._end_at_fetch.setdefault(pq, {})
        local = self._local_end(seg)
        if offset >= min(ends.get(follower, local), local):
            self._caught_up.setdefault(pq, {})[follower] = time.monotonic() if now is None else now
        ends[follower] = local
        self._settle(pq)

    def _new_epoch(self, follower: str, epoch: int) -> None:
        known = follower in self._epochs
        self._epochs[follower] = epoch
        if not known:
            return   # its first fetch here: nothing was known of another registration
        for table in (self._acked, self._caught_up, self._end_at_fetch):
            for per_copy in table.values():
                per_copy.pop(follower, None)
        for adding in self._adding.values():
            adding.discard(follower)
        log.info("follower_registered_again", follower=follower, epoch=epoch)
        self.on_new_follower_epoch(follower)

    def appended(self, pq: str, run: Run) -> None:
        """``run`` was written to ``pq`` here: the streams that copy it send it (source.py)."""
        self.on_written(pq, run)

    def _forget(self, pq: str) -> None:
        for table in (self._acked, self._caught_up, self._end_at_fetch, self._adding, self._hw, self._waiters):
            table.pop(pq, None)

    # -- the in-sync set ----------------------------------------------------------------------------------------
    def changes_wanted(self, now: float) -> list[dict[str, Any]]:
        """The in-sync sets to ask meta for: lagging followers out, caught-up ones in (each counted from now)."""
        changes = []
        for pq, seg in list(self.routes.hosted.items()):
            if seg.state != "active" or len(seg.replicas) < 2:
                continue
            end = self._local_end(seg)
            acked = self._acked.get(pq, {})
            caught = self._caught_up.setdefault(pq, {})
            adding = self._adding.setdefault(pq, set())
            keep, add = [self.me], []
            for f in seg.replicas:
                if f == self.me:
                    continue
                last = caught.setdefault(f, now)   # first sight: its time starts now
                lagging = acked.get(f, seg.physical_start) < end and now - last > LAG_MAX_S
                if f in seg.in_sync or f in adding:
                    if lagging:
                        adding.discard(f)
                    else:   # an addition asked before is asked again until the route shows it
                        (keep if f in seg.in_sync else add).append(f)
                    continue
                # It holds everything acknowledged (below the high watermark): from now on sends wait for it too,
                # before meta has decided, so it holds every acknowledged record whatever the log decides.
                if acked.get(f, -1) >= self.readable_end(seg) and self.copy_ready(seg, f):
                    adding.add(f)
                    add.append(f)
            wanted = keep + add
            if sorted(wanted) != sorted(seg.in_sync):
                changes.append({"topic": seg.topic, "queue": seg.queue, "gen": seg.gen, "in_sync": wanted,
                                "epochs": {f: self._epochs[f] for f in wanted if self._epochs.get(f)}})
        return changes

    async def run(self, propose: Callable[[list[dict[str, Any]]], Awaitable[None]],
                  may_ask: Callable[[], bool]) -> None:
        """Ask meta for the in-sync changes the followers call for, every MAINTAIN_S. A task: cancelled on stop."""
        while True:
            await asyncio.sleep(MAINTAIN_S)
            if not may_ask():
                continue
            try:
                changes = self.changes_wanted(time.monotonic())
                if changes:
                    log.info("in_sync_change_asked", changes=changes[:10], count=len(changes))
                    await propose(changes)
            except asyncio.CancelledError:
                raise
            except Exception as e:   # meta unreachable or refusing: the next round asks again
                log.warning("in_sync_change_failed", error=f"{type(e).__name__}: {e}")
