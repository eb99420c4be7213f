"""A head's producers' batches, taken from the segment it continues, so that a resend is stored once across a remap.

broker/producers.py keeps each queue's recent batches where they were stored and on every copy that streamed their
records. A failover elects such a copy, so a producer's resend after it is answered with the offsets it got. A remap
does not: it opens the next segment on a broker that may never have held the old one, and a batch stored on the old
head whose answer was lost was stored again when its producer resent it there (the chaos runner's
``queues_contiguous``, seed 49: one keyed batch at two offsets).

So every broker that holds a queue's open head, its leader and its copies, takes the batches of the segment the head
continues (the *previous* segment) from a broker that held that segment in sync: its in-sync set at its seal, leader
first. Each of them holds that segment's own batches, and by the same rule those it took for it, so a chain of remaps
with no send between them hands them on; to keep that chain whole, a broker answers for a segment only once it has
taken the batches of the one before (it goes on asking after its head is sealed, and after a restart for every
segment it holds). A broker that holds the previous segment's records itself has them already. Copies take them too,
so that a failover to one soon after a remap keeps them.

The leader answers no idempotent send of the head until it holds them, for at most HANDOVER_WAIT_S after it began to
take them: past that (every holder of the previous segment down or cut off) sends go on, logged as
``producers_not_handed_over``, and a batch held only there may be stored a second time if its producer resends it.
That wait is the price of a remap onto a broker that held nothing; a failover to an in-sync copy pays none. Asks are
grouped per holder (one request per QUEUES_PER_ASK_MAX queues waiting on it) and retried every RETRY_S while the head
is open.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import structlog

from wire.errors import ApiError

from ..peers import Peers, Unreachable
from ..producers import Batch
from ..routing import RouteTable, Segment

log = structlog.get_logger("broker.replication")

PATH = "/v1/replica/producers"
HANDOVER_WAIT_S = 2.0      # how long the leader holds idempotent sends of a new head for the previous one's batches
RETRY_S = 0.5              # between rounds of asks while some head still waits
QUEUES_PER_ASK_MAX = 64    # queues named in one ask of one holder
PRUNE_AFTER_MIN = 1_024    # segments remembered before the first scan for those the routes no longer name


def encode_ask(asks: list[tuple[Segment, Segment]], route_version: int) -> dict[str, Any]:
    """What a holder of previous segments is asked, per (head, previous): the queue's batches stored before the
    head's gen, if it holds the previous segment's records (``previous``: its physical queue). ``route_version``: the
    asker's routes, which name the previous segment sealed; the holder answers on at least those (``answer``)."""
    return {"queues": [{"topic": h.topic, "queue": h.queue, "gen": h.gen, "previous": p.physical_queue}
                       for h, p in asks], "route_version": route_version}


def encode_answer(found: list[tuple[str, int, list[Batch]]]) -> dict[str, Any]:
    return {"queues": [{"topic": t, "queue": q, "batches": [[b.producer, b.seq, b.first, b.count, b.gen]
                                                           for b in batches]} for t, q, batches in found]}


def decode_answer(body: dict[str, Any]) -> dict[tuple[str, int], list[Batch]]:
    """The batches of an answer per queue; a malformed answer (a holder of another version) raises ValueError."""
    out: dict[tuple[str, int], list[Batch]] = {}
    try:
        for q in body["queues"]:
            batches = []
            for producer, seq, first, count, gen in q["batches"]:
                if not all(type(x) is int for x in (producer, seq, first, count, gen)):
                    raise TypeError
                batches.append(Batch(producer, seq, first, count, gen))
            out[(q["topic"], q["queue"])] = batches
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"not an answer of {PATH}: {str(body)[:200]}") from None
    return out


class ProducerHandover:
    def __init__(self, me: str, routes: RouteTable, peers: Peers, holds: Callable[[Segment], bool],
                 batches: Callable[[str, int], list[Batch]], take: Callable[[str, int, list[Batch]], None]):
        """``holds(seg)``: whether this broker holds a sealed segment's records to its end (then it holds its
        batches: ``Writer.holds_sealed``); ``take(topic, queue, batches)``: merge batches of older segments into the
        producer table; ``batches(topic, queue)``: what the table holds of a queue."""
        self.me = me
        self.routes = routes
        self.peers = peers
        self._holds = holds
        self._take = take
        self._batches = batches
        self._waiting: dict[str, tuple[Segment, asyncio.Event, float]] = {}   # head's pq -> (head, taken, started)
        self._taken: set[str] = set()            # heads' pqs whose batches are here
        self._gave_up: set[str] = set()          # heads' pqs whose sends stopped waiting (logged once)
        self._unanswered: set[str] = set()       # holders whose last ask failed (logged once)
        self._kept_at_prune = 0                  # len(_taken) + len(_gave_up) after the last prune
        self._worker: asyncio.Task | None = None
        self._stopped = False

    # -- a holder of a previous segment -----------------------------------------------------------------------------
    async def answer(self, asks: list[dict[str, Any]], route_version: int) -> dict[str, Any]:
        """The batches asked for (``encode_ask``), of each queue whose previous segment this broker holds to its end
        with the batches of the segment before it (a segment still taking them is no answer yet: what it lacks, a
        broker asking would lack for good).

        Decided on routes at least as new as the asker's (a bounded wait, ``RouteTable.reach``): the asker learnt of
        the previous segment's seal first, and a holder that had not yet found nothing to answer, and the new head's
        idempotent sends waited RETRY_S for the next ask (a 0.5 s write pause in 1 of ~50 remaps back and forth)."""
        await self.routes.reach(route_version)
        found = []
        for a in asks:
            previous = self.routes.held(a["previous"])
            if (previous is not None and (previous.topic, previous.queue) == (a["topic"], a["queue"])
                    and previous.physical_queue in self._taken and self._holds(previous)):
                found.append((a["topic"], a["queue"],
                              [b for b in self._batches(a["topic"], a["queue"]) if b.gen < a["gen"]]))
        return encode_answer(found)

    # -- a holder of a segment -------------------------------------------------------------------------------------
    def route_changed(self, topic: str) -> None:
        """Begin taking the batches for every segment of ``topic`` this broker holds: the open heads it leads or
        copies, and the sealed segments it holds to their end (which it may be asked for: ``answer``)."""
        route = self.routes.routes.get(topic)
        for q in route["queues"] if route is not None else ():
            segs = self.routes.segments(topic, q["queue"]) or []
            for i, seg in enumerate(segs):
                if seg.broker == self.me or self.me in seg.replicas:
                    self._begin(segs, i)
        self._prune()

    def _prune(self) -> None:
        """Forget segments the routes no longer name here: a scan of every one, so only once the sets have doubled
        since the last (a route change of one topic must not cost a walk over every segment of the broker)."""
        kept = len(self._taken) + len(self._gave_up)
        if kept <= max(PRUNE_AFTER_MIN, 2 * self._kept_at_prune):
            return
        for done in (self._taken, self._gave_up):
            for pq in [pq for pq in done if self.routes.held(pq) is None]:
                done.discard(pq)
        self._kept_at_prune = len(self._taken) + len(self._gave_up)

    async def ready(self, head: Segment) -> None:
        """Returns once ``head`` holds the previous segment's batches, or its wait (HANDOVER_WAIT_S) is over."""
        segs = self.routes.segments(head.topic, head.queue) or []
        if not segs or segs[-1].physical_queue != head.physical_queue:
            return
        self._begin(segs, len(segs) - 1)
        waiting = self._waiting.get(head.physical_queue)
        if waiting is None or head.physical_queue in self._gave_up:
            return
        _, taken, started = waiting
        left = started + HANDOVER_WAIT_S - time.monotonic()
        try:
            await asyncio.wait_for(taken.wait(), max(left, 0.0))
        except asyncio.TimeoutError:
            if head.physical_queue not in self._gave_up:   # asks go on: a late answer still serves later resends
                self._gave_up.add(head.physical_queue)
                log.warning("producers_not_handed_over", topic=head.topic, queue=head.queue, gen=head.gen,
                            waited_s=HANDOVER_WAIT_S)

    def _begin(self, segs: list[Segment], i: int) -> None:
        """Begin taking the batches of the segment before ``segs[i]``, unless they are here."""
        seg = segs[i]
        if seg.physical_queue in self._taken or seg.physical_queue in self._waiting or self._stopped:
            return
        if seg.state != "active" and not self._holds(seg):
            return   # a sealed segment this broker does not hold whole: nobody asks it for that one
        previous = segs[i - 1] if i > 0 else None
        if previous is None or self._holds(previous):
            # The oldest segment the route carries (older ones are long past any resend), or this broker held the
            # one before: the batches are here
            self._taken.add(seg.physical_queue)
            return
        if previous.state != "sealed":
            return   # its end is not decided: nor is what it kept (the next route begins again)
        self._waiting[seg.physical_queue] = (seg, asyncio.Event(), time.monotonic())
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._run(), name="producer handover")

    async def _run(self) -> None:
        while self._waiting:
            try:
                await self._round()
            except Exception:   # a bug here must not end the asks for good; the sends' wait is bounded anyway
                log.exception("producers_handover_failed")
            if self._waiting:
                await asyncio.sleep(RETRY_S)

    async def _round(self) -> None:
        """Ask every holder for the queues waiting on it, one request per QUEUES_PER_ASK_MAX queues; a segment is
        done at its first answer."""
        asks: dict[str, list[tuple[Segment, Segment]]] = defaultdict(list)   # holder -> (segment, previous)
        for pq, (seg, _, _) in list(self._waiting.items()):
            segs = self.routes.segments(seg.topic, seg.queue) or []
            i = next((i for i, s in enumerate(segs) if s.physical_queue == pq), 0)
            if i == 0 or (segs[i].state != "active" and not self._holds(segs[i])):
                self._waiting.pop(pq)[1].set()   # the route left it (or its records) behind: nobody needs it
                continue
            for holder in segs[i - 1].in_sync:
                if holder != self.me:
                    asks[holder].append((segs[i], segs[i - 1]))
        await asyncio.gather(*(self._ask_all(holder, pairs) for holder, pairs in asks.items()))

    async def _ask_all(self, holder: str, pairs: list[tuple[Segment, Segment]]) -> None:
        """One holder's asks, QUEUES_PER_ASK_MAX queues at a time; stops at its first failure."""
        for i in range(0, len(pairs), QUEUES_PER_ASK_MAX):
            if not await self._ask(holder, pairs[i:i + QUEUES_PER_ASK_MAX]):
                return

    async def _ask(self, holder: str, pairs: list[tuple[Segment, Segment]]) -> bool:
        pairs = [(h, p) for h, p in pairs if h.physical_queue in self._waiting]   # another holder answered meanwhile
        if not pairs:
            return True
        try:
            body = await self.peers.call("POST", holder, self.routes.address(pairs[0][0].topic, holder), PATH,
                                         encode_ask(pairs, self.routes.version), remember_down=False)
            found = decode_answer(body)
        except (Unreachable, ApiError, ValueError) as e:
            if holder not in self._unanswered:   # once until it answers: the asks go on every RETRY_S
                self._unanswered.add(holder)
                log.info("producers_handover_unanswered", holder=holder, queues=len(pairs), error=str(e)[:200])
            return False
        self._unanswered.discard(holder)
        for h, _ in pairs:
            batches = found.get((h.topic, h.queue))
            if batches is None or h.physical_queue not in self._waiting:
                continue
            self._take(h.topic, h.queue, [b for b in batches if b.gen < h.gen])
            self._done(h.physical_queue)
        return True

    def _done(self, pq: str) -> None:
        waiting = self._waiting.pop(pq, None)
        if waiting is not None:
            waiting[1].set()
            self._taken.add(pq)
        self._gave_up.discard(pq)

    def stop(self) -> None:
        self._stopped = True
        if self._worker is not None:
            self._worker.cancel()
        for _, taken, _ in self._waiting.values():
            taken.set()
        self._waiting.clear()
