"""Committed offsets on every copy of a queue's head, with the rule the records follow (DESIGN.md invariant 12,
issue 37): a commit is acknowledged only once every copy the leader waits for holds it durably, so the copy a
failover elects answers every commit the old leader acknowledged.

- The leader stamps each commit ``(gen, seq)`` (broker/offsets.py) and PUTs it to every copy it waits for (the
  in-sync set of its route and the copies it asked meta to add: ``ReplicaTracker.waited_for``) while it syncs its
  own line; a copy keeps the newest stamp of each key, whatever order pushes and snapshots arrive in. Pushes are
  retried until the copy holds the commit, leaves the set waited for (meta removed it: the lag bound; 503
  REPLICATION_UNCONFIRMED when that leaves fewer copies in sync than min_insync), or REPLICATION_WAIT_S passes (503
  REPLICATION_UNCONFIRMED).
- A broker that comes to lead a head sends each copy in sync the queue's whole commit table once: meta names a new
  gen's copies in sync from its opening, and the queue's commits of older gens were on those gens' copies only.
- A copy outside the in-sync set gets no pushes and falls behind. Before the leader asks meta to add it
  (``ready``, which the tracker asks first), the leader starts pushing to it (commits do not wait for those pushes)
  and sends it a snapshot of the queue's commits, its durable ones and those still being synced; only once that has
  been stored, and no push to it is out, is the copy ready. A push to a copy not waited for that fails makes it
  unready again (it may have missed that commit).
- A copy refuses a push from the leader of a gen older than the head it knows (409 NOT_LEADER): a leader deposed by
  a failover cannot get a commit acknowledged through a copy that already follows the new one. (The commits a push
  carries keep their own gens: a snapshot holds those of older heads too.)
Kafka keeps offsets in a compacted internal topic replicated like any other; RocketMQ 5's slaves copy them every few
seconds, so a failover can take commits back. A queue's commits are few next to its records (one per consumer's
batch), so one small PUT per commit and copy costs little, and the records' streams stay as they are.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from wire.caller import Backoff
from wire.errors import ApiError, rejection

from ..offsets import KEYS_MAX, Committed, Key, OffsetStore, newer
from ..peers import Peers, Unreachable
from ..routing import RouteTable, Segment
from .leader import REPLICATION_WAIT_S, ReplicaTracker, unconfirmed

log = structlog.get_logger("broker.replication")

PATH = "/v1/replica/offsets"
PUSH_RETRY_S = 0.1          # between tries of a push to a copy waited for
COMMITS_PER_PUSH_MAX = 1000  # a snapshot goes in pushes of at most this many commits
TABLE_PAGE_MAX = 1000        # commits one answer of GET /v1/replica/offsets/{topic}/{queue} holds (in group order)
TABLE_PAGES_MAX = KEYS_MAX // TABLE_PAGE_MAX + 1   # pages a table can take: more is not an answer
TAKE_OVER_BACKOFF = Backoff(0.2, 5.0, jitter=False)   # a head taking over its queue's commits, while a holder is away
TAKE_OVERS_AT_ONCE = 64      # take-overs asking meta and the older holders at once (a failover may open thousands)


def encode(head: Segment, values: list[tuple[Key, Committed]]) -> dict[str, Any]:
    """A push of commits of ``head``'s queue (each may be of an older gen: a snapshot carries what the leader holds),
    fenced by the gen of the head the pushing leader leads."""
    return {"topic": head.topic, "queue": head.queue, "leader_gen": head.gen,
            "commits": [{"group": g, "offset": v.offset, "gen": v.gen, "seq": v.seq} for (g, _, _), v in values]}


def decode(body: dict[str, Any]) -> tuple[str, int, int, list[tuple[Key, Committed]]]:
    """(topic, queue, leader_gen, commits) of a push (checked by the API's model, broker/api/models.py
    ReplicaOffsets)."""
    t, q = body["topic"], body["queue"]
    return t, q, body["leader_gen"], [((c["group"], t, q), Committed(c["offset"], c["gen"], c["seq"]))
                                      for c in body["commits"]]


async def _none_older(seg: Segment) -> list[tuple[Key, Committed]]:
    return []


class OffsetCopies:
    def __init__(self, me: str, routes: RouteTable, tracker: ReplicaTracker, store: OffsetStore, peers: Peers):
        self.me = me
        self.routes = routes
        self.tracker = tracker
        self.store = store
        self.peers = peers
        self._pushed: dict[str, set[str]] = {}     # pq -> copies not waited for that get every commit now
        self._ready: dict[str, set[str]] = {}      # pq -> of those, the ones whose snapshot was stored
        self._syncing: dict[tuple[str, str], asyncio.Task] = {}          # (pq, copy) -> its snapshot
        self._in_flight: dict[str, dict[str, Committed]] = {}            # pq -> group -> commit not yet answered
        self._aside: dict[tuple[str, str], int] = {}   # (pq, copy) -> pushes out to a copy not waited for
        self._tasks: dict[asyncio.Task, None] = {}   # an ordered set: cancelled in the order started
        self._opened: dict[str, set[str]] = {}   # topic -> heads led here whose copies in sync got its commits
        self._taking: dict[str, asyncio.Task] = {}   # pq -> a head's take-over of its queue's older commits
        self._take_over_slots = asyncio.Semaphore(TAKE_OVERS_AT_ONCE)
        # The queue's commits the brokers of a head's older segments hold (broker/reads.py ``older_commits``); none
        # without a reader (a unit test)
        self.older_commits: Callable[[Segment], Awaitable[list[tuple[Key, Committed]]]] = _none_older

    # -- the leader ---------------------------------------------------------------------------------------------
    async def commit(self, head: Segment, group: str, offset: int) -> None:
        """Store a commit of ``head``'s queue here and on every copy waited for; raises what the store or the
        copies refuse with (503 NOT_ENOUGH_REPLICAS below min_insync, like a send)."""
        self.tracker.check_writable(head, "the commit")
        pq, key = head.physical_queue, (group, head.topic, head.queue)
        value = self.store.stamp(offset, head.gen)
        in_flight = self._in_flight.setdefault(pq, {})
        in_flight[group] = value   # a snapshot started before this commit is stored carries it
        waited = self.tracker.waited_for(head)
        for copy in sorted(self._pushed.get(pq, set()) - waited - {self.me}):
            self._push_aside(head, copy, [(key, value)])
        try:
            results = await asyncio.gather(self.store.store([(key, value)]),
                                           *(self._push(head, c, [(key, value)]) for c in sorted(waited)),
                                           return_exceptions=True)
        finally:
            if in_flight.get(group) is value:
                del in_flight[group]
            if not in_flight and self._in_flight.get(pq) is in_flight:
                del self._in_flight[pq]
        for r in results:
            if isinstance(r, BaseException):
                raise r

    async def _push(self, head: Segment, copy: str, values: list[tuple[Key, Committed]]) -> None:
        """To a copy waited for: until it holds the values, leaves the copies waited for, or the head moves."""
        pq = head.physical_queue
        deadline = time.monotonic() + REPLICATION_WAIT_S
        while True:
            try:
                await self.peers.call("PUT", copy, self.routes.address(head.topic, copy), PATH, encode(head, values))
                return
            except (ApiError, Unreachable) as e:
                why = e.code if isinstance(e, ApiError) else e.reason
            now = self.routes.held(pq)
            if now is None or now.broker != self.me:
                return   # the head moved on: the commit's caller refuses it (Writer.still_offsets_head)
            if copy not in self.tracker.waited_for(now):
                self._unready(pq, copy)   # it may miss this commit: a snapshot first, before it is waited for
                self.tracker.still_enough(now, "the commit is")
                return
            if time.monotonic() > deadline:
                raise unconfirmed(head, f"copy {copy} did not store the commit within {REPLICATION_WAIT_S:.0f} s "
                                        f"({why})", "the commit is")
            await asyncio.sleep(PUSH_RETRY_S)

    def _push_aside(self, head: Segment, copy: str, values: list[tuple[Key, Committed]]) -> None:
        """To a copy getting ready, not waited for: the commit does not wait (a slow copy would hold it), and the
        copy is not ready while the push is out (``ready``); failed, it needs a snapshot again."""
        pq = head.physical_queue
        self._aside[(pq, copy)] = self._aside.get((pq, copy), 0) + 1

        async def push() -> None:
            try:
                await self.peers.call("PUT", copy, self.routes.address(head.topic, copy), PATH, encode(head, values))
            except (ApiError, Unreachable):
                self._unready(pq, copy)
            finally:
                left = self._aside.pop((pq, copy)) - 1
                if left:
                    self._aside[(pq, copy)] = left

        task = asyncio.create_task(push(), name=f"offsets-push-{pq}")
        self._tasks[task] = None
        task.add_done_callback(lambda t: self._tasks.pop(t, None))

    def ready(self, seg: Segment, copy: str) -> bool:
        """Whether ``copy`` holds every commit of ``seg``'s queue, so that the leader may wait for it (the
        tracker asks before it asks meta to add a copy to the in-sync set). When not, its snapshot starts."""
        pq = seg.physical_queue
        if copy in self._ready.get(pq, ()):
            return (pq, copy) not in self._aside
        if (pq, copy) not in self._syncing:
            self._pushed.setdefault(pq, set()).add(copy)   # from now on, before the snapshot is taken
            self._syncing[(pq, copy)] = asyncio.create_task(self._sync(seg, copy), name=f"offsets-snapshot-{pq}")
        return False

    def _send_to_copies_in_sync(self, topic: str) -> None:
        """Each head of ``topic`` this broker has come to lead (a failover, a remap, a growth) takes over the queue's
        commits of its older segments (``_take_over``), then its copies in sync get the queue's whole commit table
        once, as a copy joining the set does. Meta names a new gen's copies in sync from its opening, its records
        being none yet, but the queue's commits of older gens were only on the copies of those gens (the chaos
        runner, seed 49: a commit b1 made under gen 4 was on b1 and b2; gen 5 opened with b3 in sync, back on an
        empty disk, and gen 6 on b2 with b3; b1 and b2 lost their disks, and b3 read the group's
        committed offset back at an older commit). One that failed is sent again at the topic's next route change.
        Only the topic's own heads are looked at: a route change of one topic costs nothing per head led elsewhere
        (a broker of the million-queue bench leads a third of them)."""
        opened = self._opened.setdefault(topic, set())
        for pq in [pq for pq in opened if not self._leads_active(pq)]:
            opened.discard(pq)
        route = self.routes.routes.get(topic)
        for q in route["queues"] if route is not None else ():
            seg = self.routes.head(topic, q["queue"])
            if seg is None or not self._leads_active(seg.physical_queue) or seg.physical_queue in opened:
                continue
            pq = seg.physical_queue
            opened.add(pq)
            if pq not in self._taking:
                self._taking[pq] = asyncio.create_task(self._take_over(seg), name=f"offsets-take-over-{pq}")

    async def _take_over(self, seg: Segment) -> None:
        """A head this broker has come to lead: first the queue's commits held by the brokers of its older segments
        come here, durably (``older_commits``: broker/reads.py), then its copies in sync get the whole table. Left on
        the older segments' holders, a commit had as many copies as the in-sync set it was made under, and lost them
        when those disks went, though the head's own copies stood (the chaos runner, seed 20: a commit made on b3
        and b2, b3 wiped, the queue remapped twice, b2 wiped ten seconds later: read back as -1). Asked again while
        a holder is away, as long as this broker leads the head."""
        pq = seg.physical_queue
        failures = 0
        try:
            while True:
                if not self._leads_active(pq):
                    return
                try:
                    async with self._take_over_slots:
                        values = await self.older_commits(seg)
                        for i in range(0, len(values), COMMITS_PER_PUSH_MAX):
                            await self.store.store(values[i:i + COMMITS_PER_PUSH_MAX])
                    break
                except (ApiError, Unreachable) as e:
                    if failures == 0:
                        log.info("offsets_take_over_waits", pq=pq, error=str(e))
                        self._sync_copies(seg)   # what this broker holds goes to the copies meanwhile
                    failures += 1
                    await asyncio.sleep(TAKE_OVER_BACKOFF.delay_s(failures))
            if values or failures:   # not a line per head of a topic just created
                log.info("offsets_taken_over", pq=pq, commits=len(values), tries=failures + 1)
            self._sync_copies(seg)
        finally:
            self._taking.pop(pq, None)

    def _sync_copies(self, seg: Segment) -> None:
        """The queue's whole commit table to each copy in sync of ``seg`` (a head led here) not being sent it now."""
        pq = seg.physical_queue
        for copy in sorted(self.tracker.waited_for(seg)):
            if (pq, copy) not in self._syncing:
                self._syncing[(pq, copy)] = asyncio.create_task(self._sync(seg, copy, opened=True),
                                                                name=f"offsets-snapshot-{pq}")

    async def _sync(self, seg: Segment, copy: str, opened: bool = False) -> None:
        pq = seg.physical_queue
        try:
            values = dict(self.store.queue_values(seg.topic, seg.queue))
            for group, v in list(self._in_flight.get(pq, {}).items()):
                key = (group, seg.topic, seg.queue)
                if newer(v, values.get(key)):
                    values[key] = v
            items = sorted(values.items())
            for i in range(0, len(items), COMMITS_PER_PUSH_MAX):
                await self.peers.call("PUT", copy, self.routes.address(seg.topic, copy), PATH,
                                      encode(seg, items[i:i + COMMITS_PER_PUSH_MAX]))
            if copy in self._pushed.get(pq, ()):   # no push to it failed meanwhile
                self._ready.setdefault(pq, set()).add(copy)
                log.info("offsets_snapshot_stored", pq=pq, copy=copy, commits=len(items))
        except (ApiError, Unreachable) as e:
            log.info("offsets_snapshot_failed", pq=pq, copy=copy, error=str(e))
            self._unready(pq, copy)
            if opened:
                self._opened.get(seg.topic, set()).discard(pq)
        finally:
            self._syncing.pop((pq, copy), None)

    def forget_copy(self, copy: str) -> None:
        """``copy`` registered again (a new disk, maybe): every queue's commits go to it afresh, snapshot first."""
        for pq in {*self._pushed, *self._ready}:
            self._unready(pq, copy)

    def _unready(self, pq: str, copy: str) -> None:
        self._pushed.get(pq, set()).discard(copy)
        self._ready.get(pq, set()).discard(copy)

    def route_changed(self, topic: str) -> None:
        """``topic``'s route changed: what is kept of a head this broker no longer leads goes; the copies of a head
        of ``topic`` it has come to lead get the queue's commits."""
        for pq in {*self._pushed, *self._ready}:
            if not self._leads_active(pq):
                self._pushed.pop(pq, None)
                self._ready.pop(pq, None)
        self._send_to_copies_in_sync(topic)
        if not self._opened.get(topic):
            self._opened.pop(topic, None)

    def _leads_active(self, pq: str) -> bool:
        seg = self.routes.hosted.get(pq)
        return seg is not None and seg.state == "active" and seg.broker == self.me

    def stop(self) -> None:
        for task in [*self._syncing.values(), *self._taking.values(), *self._tasks]:
            task.cancel()

    # -- a copy -------------------------------------------------------------------------------------------------
    async def receive(self, topic: str, queue: int, leader_gen: int, values: list[tuple[Key, Committed]]) -> None:
        """Store what the leader of ``topic``/``queue``'s head of ``leader_gen`` pushed; 409 NOT_LEADER when a newer
        head of the queue is known here (a failover deposed the pusher)."""
        head = self.routes.head(topic, queue)
        if head is not None and head.gen > leader_gen:
            raise rejection(409, "NOT_LEADER", f"{topic}/{queue} has a head of gen {head.gen} here, newer than the "
                            f"pushing leader's {leader_gen}", topic=topic, queue=queue, gen=head.gen)
        await self.store.store(values)
