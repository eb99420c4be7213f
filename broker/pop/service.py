"""Pop, ack, change of invisible time, dead letters and the handover of pop state between heads.

The one place that ties the pure state (state.py) to the journal, the reviver, the reader and the other brokers.
Pops of one (group, topic, queue) never run at once (a lock per key: a topic-wide pop skips a queue another pop is
working on, a pop of one queue waits for it), so two pops never share a delivery. See broker/pop/__init__.py for the
design across remaps.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any, NamedTuple
from urllib.parse import quote

import structlog

from runtime.credentials import require_broker
from wire.errors import ApiError, rejection

from ..chores import Chores
from ..codec import RawMessage, RawPopped, messages
from ..peers import Unreachable
from ..reads import PULL_BYTES_MAX, Reader
from ..routing import RouteTable, Segment
from ..storage import files
from ..writes import not_leader
from . import journal as journal_mod
from .dlq import DeadLetters
from .handles import Handle, HandleCodec, load_secret
from .keyed_locks import KeyedLocks, LockWaitExpired
from .limits import (ACK_OUTCOMES_REMEMBERED_MAX, BUSY_QUEUE_WAIT_MS, DLQ_RETRY_MS, HANDOVER_PEERS_MAX, IN_FLIGHT_MAX,
                     IN_FLIGHT_PER_QUEUE_MAX, POP_QUEUES_MAX, POP_WAITERS_MAX)
from .revive import Reviver
from .settings import GroupSettings
from .replica import ReplicaPopStore
from .state import DONE, EXPIRED, LIVE, Delivery, Key, QueueState
from .wakeup import TopicSignals

# Harmless mutants: the words and fields of the log calls (no code reads them).
log = structlog.get_logger("broker.pop")

SEQ_BITS = 32                    # deliveries per incarnation; the incarnation sits above
HEAP_CHECK_EVERY = 10_000        # deliveries scheduled between two looks at the revive heap's size
# How long an old head waits to see the route that moved the queue away, and then for the key's lock (a pop or a
# journal round under way): both within the asker's PEER_REQUEST_TIMEOUT_S (5 s), so that it hears 503 CATCHING_UP
# and asks again, rather than time out and take this broker for down (PEER_DOWN_S, for every request to it). Waiting
# 5 s for the route alone, an old head holding the only copy of a group's state answered the new head's every ask
# too late while a journal round held the key (the chaos runner, seed 49, seventh run: b2 took b3 for down for 10 s,
# until b3 lost its disk, and started the group over from offset 0).
HANDOVER_WAIT_S = 2.0
HANDOVER_LOCK_WAIT_S = 2.0
TAKEOVER_RETRY_S = 1.0           # a key whose takeover could not finish is tried again no sooner
TAKEOVER_WORKERS = 8             # keys taken over from copies at once: one waiting on a peer holds no other back


def _queue_path(what: str, key: Key) -> str:
    """A broker-to-broker path of one group's state of one queue (``pop-handover``, ``pop-adopt``)."""
    group, topic, queue = key
    # Harmless mutants: safe='XXXX' for either name (letters are always safe, '/' stays quoted) and the topic's default
    # safe='/' (a topic name is [A-Za-z0-9_-]+: wire/names.py).
    return f"/v1/{what}/{quote(group, safe='')}/{quote(topic, safe='')}/{queue}"


def now_ms() -> int:
    return int(time.time() * 1000)


def _code(code: str, handle: Any) -> dict[str, Any]:
    return {"handle": handle if isinstance(handle, str) else None, "ok": False, "code": code}


def invalid_handle(why: str) -> ApiError:
    # Harmless mutant: status None (ApiError's default status is 400).
    return rejection(400, "INVALID_HANDLE", f"the handle is malformed or unknown to this broker: {why}")


def handle_expired(why: str) -> ApiError:
    return rejection(409, "HANDLE_EXPIRED", f"the handle no longer names a delivery in flight: {why}")


class Found(NamedTuple):
    """An older holder's pop state of a key as it answered a takeover (``freeze`` writes it, ``of`` reads it): its
    gen, its pop offset, and the deliveries it had in flight ([offset, attempt, deadline_ms]), which the asker
    adopts if it starts from this state."""
    gen: int
    next_offset: int
    deliveries: list[list[int]]

    @classmethod
    def of(cls, body: dict[str, Any]) -> "Found | None":
        if not body.get("found"):
            return None
        return cls(int(body["gen"]), int(body["next_offset"]),
                   [[int(o), int(attempt), int(deadline)] for o, attempt, deadline in body.get("deliveries", [])])


def _next_incarnation(path: str) -> int:
    raw = files.read_file(path)
    n = int(raw) + 1 if raw and raw.strip().isdigit() else 1
    files.write_atomic(path, str(n).encode())
    files.sync_dir(os.path.dirname(path))
    return n


class PopService:
    def __init__(self, me: str, data_dir: str, routes: RouteTable, reader: Reader, ready: Callable[[], bool],
                 settings: GroupSettings, signals: TopicSignals, driven: bool = False):
        """``driven``: no thread of its own (BrokerNode's): the dead-letter store closes its queues in series."""
        # Harmless mutant: driven's default True (BrokerNode always passes it; it only picks threads or series for
        # closing the dead-letter queues, which close either way).
        self.me = me
        self.routes = routes
        self.reader = reader
        self.settings = settings
        self.signals = signals
        self._ready = ready
        root = os.path.join(data_dir, "pop")
        os.makedirs(root, exist_ok=True)
        self.codec = HandleCodec(load_secret(os.path.join(root, "handle.key")))
        self._seq_base = _next_incarnation(os.path.join(root, "incarnation")) << SEQ_BITS
        self._seq = 0
        states, whole = journal_mod.load(os.path.join(root, "journal.log"))
        self.states: dict[Key, QueueState] = states
        self.journal = journal_mod.Journal(os.path.join(root, "journal.log"), states, whole)
        self.replica = ReplicaPopStore(os.path.join(root, "replica.log"))   # copies of queues led elsewhere
        self.dlq = DeadLetters(os.path.join(root, "dlq"), driven)
        self.reviver = Reviver(self._fire)
        self.locks = KeyedLocks(lambda key: self.signals.notify(key[1]))
        # (key, offset) -> (seq, acked) of its last delivery that ended here: acked through that handle, or not
        # (superseded, dead-lettered, moved to another head); a repeat of the ack is answered DONE
        self._outcomes: OrderedDict[tuple[Key, int], tuple[int, bool]] = OrderedDict()
        self._chores = Chores("pop_chore_failed")
        self._handing: set[Key] = set()
        self._takeovers: deque[Key] = deque()       # keys held as copies or hinted, queued to be taken over
        self._takeover_queued: set[Key] = set()      # ... those, and the ones being taken over now
        self._takeover_retry_at: dict[Key, float] = {}   # monotonic: a key whose takeover could not finish
        self._takeover_workers = 0
        # Harmless mutant: None for False (only tested for truth).
        self._takeover_retry_pending = False
        self._hinted_here: set[Key] = set()          # keys of queues led here an older holder told of (take_over_soon)
        self._hinted_heads: dict[Key, int] = {}      # key -> the gen of the head told of it (hint_new_heads)
        # (topic, queue, what): 503 NOT_ENOUGH_REPLICAS when the queue is led here below its min_insync (node.py)
        # Harmless mutants: None for the default (BrokerNode sets its own before the service answers anything) and 0
        # for its None (nobody reads what it returns); None or 1 for _in_flight_total (_pop_once sets it before any
        # read: only the pop path reads it).
        self.check_copies: Callable[[str, int, str], None] = lambda topic, queue, what: None
        self._in_flight_total = 0
        self._scheduled = 0
        self._waiters = 0
        self._rotation = 0
        self._led: dict[str, frozenset[int]] = {}   # topic -> the queues this broker leads, as its last route said
        self.popped = 0
        self.redelivered = 0
        self.dead_lettered = 0

    # -- lifecycle -----------------------------------------------------------------------------------------------
    async def start(self) -> None:
        for key, st in self.states.items():
            for offset, d in list(st.in_flight.items()):
                if d.dead:
                    self._spawn(self._dead_letter(key, offset, resumed=True))
                else:
                    # A new number: the journal may have lost the line of a later delivery of it (a power loss: a
                    # delivery is not synced before the pop is answered), and the handle that delivery superseded
                    # must not work again (the chaos runner's fixed seed, stale_pop_acks). Every handle of a
                    # delivery in flight before a restart is refused after it; the message comes back once due.
                    # Harmless mutant: d.dead left out (False here, as its default).
                    st.in_flight[offset] = Delivery(self._next_seq(), d.attempt, d.deadline_ms, d.written, d.dead)
                    st.dirty.add(offset)
                    self._schedule(key, offset, st.in_flight[offset].seq, d.deadline_ms)
            if st.dirty:
                self.journal.touch(key)
            if st.frozen and st.in_flight:
                st.hand_over_all()
                self._hand_over_soon(key)
        self.journal.start()
        self.reviver.start()

    async def stop(self) -> None:
        await self.reviver.stop()
        await self._chores.cancel_all()
        await self.journal.close()
        self.replica.close()
        self.dlq.close()

    def _spawn(self, work) -> None:
        self._chores.spawn(work)   # named by its function: "PopService._dead_letter" and so on

    def _next_seq(self) -> int:
        self._seq += 1
        assert self._seq < 1 << SEQ_BITS
        return self._seq_base | self._seq

    def _schedule(self, key: Key, offset: int, seq: int, deadline_ms: int) -> None:
        """Put a deadline on the revive heap; now and then drop the entries of deliveries acked or superseded
        meanwhile, so the heap stays proportional to what is in flight."""
        self.reviver.schedule(deadline_ms, key, offset, seq)
        # Harmless mutant: -= 1 (-n % HEAP_CHECK_EVERY is 0 exactly when n % HEAP_CHECK_EVERY is; nothing else reads
        # it).
        self._scheduled += 1
        if self._scheduled % HEAP_CHECK_EVERY == 0:
            live = self.in_flight_total()
            if len(self.reviver) > 4 * live + HEAP_CHECK_EVERY:
                self.reviver.rebuild((d.deadline_ms, d.seq, k, o) for k, st in self.states.items()
                                     for o, d in st.in_flight.items() if not d.dead and o not in st.ready)

    def _remember(self, key: Key, offset: int, seq: int, acked: bool) -> None:
        self._outcomes[(key, offset)] = (seq, acked)
        self._outcomes.move_to_end((key, offset))
        while len(self._outcomes) > ACK_OUTCOMES_REMEMBERED_MAX:
            self._outcomes.popitem(last=False)   # harmless mutant: last=None (falsy, as False)

    def in_flight_total(self) -> int:
        return sum(len(st.in_flight) for st in self.states.values())

    # -- pop -----------------------------------------------------------------------------------------------------
    async def pop(self, topic: str, group: str, max_n: int, invisible_ms: int, queue: int | None, order: bool,
                  wait_ms: int) -> list[RawPopped]:
        self._require_ready("pops")
        deadline = time.monotonic() + wait_ms / 1000
        while True:
            stamp = self.signals.stamp(topic)
            out = await self._pop_once(topic, group, max_n, invisible_ms, queue, order)
            left = deadline - time.monotonic()
            if out or left <= 0:
                return out
            if self._waiters >= POP_WAITERS_MAX:
                raise rejection(503, "TOO_MANY_WAITERS", "too many pops are long-polling on this broker; retry "
                                "shortly or with a shorter wait_ms", limit=POP_WAITERS_MAX)
            self._waiters += 1
            try:
                await self.signals.wait(topic, stamp, left)
            finally:
                self._waiters -= 1

    def _heads_here(self, topic: str, count: int) -> list[tuple[int, Segment]]:
        """The queues of ``topic`` whose head this broker leads, writable (its logic start decided)."""
        heads = [(q, self.routes.head(topic, q)) for q in range(count)]
        return [(q, h) for q, h in heads if h is not None and h.broker == self.me and h.logic_start is not None]

    def route_applied(self, topic: str) -> None:
        """A route of ``topic`` applied: when it made this broker the head of a queue it did not lead, the pops
        waiting on the topic look again now (a remap moved a queue here with messages ready: they slept to the end of
        their wait). Not at every route change: a topic's config writes change its route too."""
        route = self.routes.routes.get(topic)
        count = len(route["queues"]) if route is not None else 0
        led = frozenset(q for q, _ in self._heads_here(topic, count))
        before = self._led.pop(topic, frozenset())
        if led:
            self._led[topic] = led   # at most one entry per topic led here
        if led - before:
            self.signals.notify(topic)

    def route_deleted(self, topic: str) -> None:
        """``topic`` was deleted: nothing of it is led here any more (``_led`` holds only topics with a route)."""
        self._led.pop(topic, None)

    def _queues(self, topic: str, queue: int | None) -> list[tuple[int, Segment]]:
        route = self.routes.routes.get(topic)
        if route is None:
            raise rejection(404, "TOPIC_NOT_FOUND", f"topic {topic!r} is unknown to this broker", topic=topic)
        count = len(route["queues"])
        if queue is not None:
            if queue >= count:
                raise rejection(404, "QUEUE_NOT_FOUND", f"queue {queue} does not exist", topic=topic, queue=queue)
            head = self.routes.head(topic, queue)
            if head is None or head.broker != self.me:
                raise not_leader(topic, queue, head)
            if head.logic_start is None:
                raise rejection(503, "SEALING", "the queue is being remapped; retry shortly", topic=topic,
                                queue=queue)
            return [(queue, head)]
        mine = self._heads_here(topic, count)
        self._rotation += 1
        if mine:
            i = self._rotation % len(mine)
            mine = mine[i:] + mine[:i]   # each pop starts at another queue: none is starved by the ones before it
        return mine

    async def _pop_once(self, topic: str, group: str, max_n: int, invisible_ms: int, queue: int | None,
                        order: bool) -> list[RawPopped]:
        queues = self._queues(topic, queue)
        self._in_flight_total = self.in_flight_total()
        out: list[RawPopped] = []
        saturated = 0
        busy: list[Key] = []
        for phase in ("retry", "new"):          # redeliveries first, over every queue, so retries never starve
            for q, _ in queues:
                if len(out) >= max_n:
                    break
                key = (group, topic, q)
                if queue is None and self.locks.busy(key):
                    if phase == "new":
                        busy.append(key)   # another pop works on it: never share a delivery
                    continue
                taken = await self._take_under_lock(key, phase, max_n - len(out), invisible_ms, order, queue)
                if taken is None:
                    saturated += 1
                else:
                    out += taken
        for key in busy:
            # Nothing (or not enough) on the free queues: wait for a busy one rather than answer without it.
            if len(out) >= max_n:
                break
            try:
                # Harmless mutants: / 1001 (999 ms for 1 s; the log names the constant); "new" misspelt in the phases
                # below (the saturation check it skips only makes None of []: _deliver_new is bounded by the same
                # limits); queue None in the call (busy keys are only those of a pop with queue None).
                async with asyncio.timeout(BUSY_QUEUE_WAIT_MS / 1000):
                    for phase in ("retry", "new"):
                        out += await self._take_under_lock(key, phase, max_n - len(out), invisible_ms, order,
                                                           queue) or []
            except TimeoutError:
                log.info("pop_busy_queue_skipped", topic=topic, queue=key[2], waited_ms=BUSY_QUEUE_WAIT_MS)
        if not out and saturated and saturated == len(queues):
            raise rejection(409, "TOO_MANY_IN_FLIGHT", "every queue popped holds as many invisible messages as it "
                            "may: ack some first", in_flight_per_queue_max=IN_FLIGHT_PER_QUEUE_MAX,
                            in_flight_max=IN_FLIGHT_MAX)
        superseding = {(topic, p.queue) for p in out if p.attempt > 1}
        if superseding:
            # A delivery again gives its message a new handle and expires the one out there: answered only once that
            # is on this disk and the copies, as a change of invisible time is. Else a power loss or a failover would
            # bring back the older delivery, and an ack through the superseded handle would be answered ok (the
            # chaos runner's stale_pop_acks, seed 49: a power loss of the whole machine 6 s after the redelivery).
            # A first delivery supersedes nothing and stays lazy (state.py). If this fails, the deliveries stay in
            # flight here with handles nobody holds, and go out again once due.
            await self.journal.durable(confirm=superseding)
        return out

    async def _take_under_lock(self, key: Key, phase: str, n: int, invisible_ms: int, order: bool,
                               queue: int | None) -> list[RawPopped] | None:
        """What one queue hands out in ``phase`` under its lock; None when it is saturated (no new delivery)."""
        try:
            async with self.locks.hold(key):
                st = await self._state_for(key)
                # Harmless mutant: n < 0 (n is 0 only in the busy-queue loop's second phase, where _take hands out
                # nothing for 0: _redeliver of no offsets, _deliver_new bounded by n).
                if st is None or n <= 0:
                    return []
                if phase == "new" and (len(st.in_flight) >= IN_FLIGHT_PER_QUEUE_MAX
                                       or self._in_flight_total >= IN_FLIGHT_MAX):
                    return None
                return await self._take(st, phase, n, invisible_ms, order)
        except ApiError as e:
            if queue is not None:
                raise
            log.info("pop_queue_skipped", topic=key[1], queue=key[2], code=e.code)
            return []

    async def _take(self, st: QueueState, phase: str, n: int, invisible_ms: int, order: bool) -> list[RawPopped]:
        if st.frozen:
            return []
        if order:
            if st.blocked(now_ms()):
                return []
            if phase == "retry":
                return await self._redeliver(st, sorted(st.ready)[:n], invisible_ms)
            if st.ready:
                return []   # a batch came due: it goes out again, alone and in order, before anything new
            return await self._deliver_new(st, n, invisible_ms)
        if phase == "retry":
            return await self._redeliver(st, list(st.ready)[:n], invisible_ms)
        return await self._deliver_new(st, n, invisible_ms)

    async def _deliver_new(self, st: QueueState, n: int, invisible_ms: int) -> list[RawPopped]:
        group, topic, queue = st.key
        # Harmless mutant: n < 0 below (n is at least 1 here: _take_under_lock answers n <= 0 and a saturated queue
        # before, with no await between).
        n = min(n, IN_FLIGHT_PER_QUEUE_MAX - len(st.in_flight), IN_FLIGHT_MAX - self._in_flight_total)
        if n <= 0:
            return []
        res = await self.reader.pull(topic, queue, st.next_offset, n)
        now = now_ms()
        out = []
        for m in messages(res["messages"]):
            if m.offset < st.next_offset:
                continue
            seq = self._next_seq()
            d = st.deliver_new(m.offset, seq, now, invisible_ms)
            self._schedule(st.key, m.offset, seq, d.deadline_ms)
            out.append(self._popped(group, topic, queue, m, seq, d.attempt))
        st.skip_to(res["next_offset"])
        self.journal.touch(st.key)
        self.popped += len(out)
        self._in_flight_total += len(out)
        return out

    async def _redeliver(self, st: QueueState, offsets: list[int], invisible_ms: int) -> list[RawPopped]:
        if not offsets:
            return []
        group, topic, queue = st.key
        found, gone = await self._read_offsets(topic, queue, offsets)
        now = now_ms()
        out = []
        for offset in offsets:
            if offset not in st.ready:
                continue                        # acked late while this pop read
            m = found.get(offset)
            if m is None:
                if offset in gone:
                    st.ack(offset)              # the queue no longer holds it (retention): nothing to deliver
                continue                        # not read this time (byte budget, a broker down): a later pop
            seq = self._next_seq()
            d = st.redeliver(offset, seq, now, invisible_ms)
            self._schedule(st.key, offset, seq, d.deadline_ms)
            out.append(self._popped(group, topic, queue, m, seq, d.attempt))
        self.journal.touch(st.key)
        self.journal.kick()
        self.redelivered += len(out)
        return out

    def _popped(self, group: str, topic: str, queue: int, m: RawMessage, seq: int, attempt: int) -> RawPopped:
        return RawPopped(queue, m.offset, self.codec.encode(group, Handle(topic, queue, m.offset, seq)), attempt,
                         m.payload)

    async def _read_offsets(self, topic: str, queue: int, offsets: list[int]) -> tuple[dict[int, RawMessage],
                                                                                          set[int]]:
        """The messages at ``offsets`` that one pop's byte budget reads, run by run, and the offsets the storage says
        it no longer holds (below its oldest message, or stepped over as a dead broker's bounded gap). An offset in
        neither was not read this time (the budget, a broker down) and stays ready for a later pop: a read that
        stops early is not a retention that deleted it."""
        found: dict[int, RawMessage] = {}
        gone: set[int] = set()
        runs: list[list[int]] = []
        for o in sorted(offsets):
            if runs and o == runs[-1][-1] + 1:
                runs[-1].append(o)
            else:
                runs.append([o])
        budget = PULL_BYTES_MAX
        for run in runs:
            if budget <= 0:
                break
            res = await self.reader.read_history(topic, queue, run[0], len(run))
            for m in messages(res["messages"]):
                found[m.offset] = m
                budget -= len(m.payload)
            stepped = res["next_offset"] if not res.get("unavailable") else res["min_offset"]
            gone.update(o for o in run if o not in found and (o < res["min_offset"] or o < stepped))
        return found, gone

    # -- ack and change of invisible time ------------------------------------------------------------------------
    def _check(self, group: str, raw: Any) -> tuple[str, Handle | None, QueueState | None]:
        return self._verdict(group, self.codec.decode(group, raw))

    def _verdict(self, group: str, h: Handle | None) -> tuple[str, Handle | None, QueueState | None]:
        """A decoded handle (None: not this broker's for ``group``) against the state now."""
        if h is None:
            return "INVALID_HANDLE", None, None
        st = self.states.get((group, h.topic, h.queue))
        if st is None:
            return "INVALID_HANDLE", h, None
        verdict = st.check(h.offset, h.seq)
        if verdict == LIVE:
            if st.frozen and h.offset in st.ready:
                # The queue moved: it is the new head's now (handed over, or being handed over right now, due or
                # not: ``freeze``); an ok here could not stop the head from delivering it again.
                return "HANDLE_EXPIRED", h, st
            if not st.frozen and self._deposed(st):
                return "HANDLE_EXPIRED", h, st
            return "", h, st
        if verdict == EXPIRED:
            return "HANDLE_EXPIRED", h, st
        if verdict == DONE:
            seen = self._outcomes.get((st.key, h.offset))
            if seen is None and h.offset < st.moved_below:
                # Out of this broker's memory (restarted since, or evicted), and maybe handed to a newer head that
                # delivers it again once due: never ok (an old head restarted after handing a delivery over answered
                # its handle's ack ok, and the new head delivered the message again: tests/test_pop.py)
                return "HANDLE_EXPIRED", h, st
            if seen is None:
                return "DONE", h, st            # acked or dead-lettered here before this broker's memory reaches
            seq, acked = seen
            if acked and seq == h.seq:
                return "DONE", h, st
            return ("HANDLE_EXPIRED", h, st) if seq >= h.seq else ("INVALID_HANDLE", h, st)
        return "INVALID_HANDLE", h, st

    def _check_copies(self, checked: list[tuple[str, Handle | None, QueueState | None]], what: str) -> None:
        """503 NOT_ENOUGH_REPLICAS, before anything is applied, when a queue of a live handle is led here with fewer
        copies in sync than its topic's min_insync: an ack or a change of invisible time follows the rule a send
        does. A frozen state's (the queue moved on) is this broker's alone to answer."""
        for topic, queue in {(h.topic, h.queue) for code, h, st in checked if code == "" and not st.frozen}:
            self.check_copies(topic, queue, what)

    def _deposed(self, st: QueueState) -> bool:
        """A failover moved the queue off this broker (another copy sealed the gen it popped under): that copy took
        the state over, deliveries in flight included, and delivers them again; an ack here could not stop that
        (the chaos runner: a leader cut off and back answered acks the new head never heard of). A remap instead
        leaves the seal to this broker, and its in-flight deliveries stay this broker's to answer."""
        group, topic, queue = st.key
        head = self.routes.head(topic, queue)
        if head is None or head.gen <= st.gen:
            return False
        seg = next((s for s in self.routes.segments(topic, queue) or () if s.gen == st.gen), None)
        return seg is not None and seg.sealer is not None and seg.sealer != self.me

    def _require_ready(self, what: str) -> None:
        """503 CATCHING_UP while this broker's meta session has lapsed or its routes are behind the log. A broker cut
        off from meta may have lost the queue's head without hearing of it: popping on could hand out what the new
        head hands out too, and an ack could be answered from a state a failover took over (the chaos runner's
        fixed seed: a broker back from a power loss answered ok, from its journal, an ack of a handle it had
        superseded before it lost the line that said so, while its routes did not yet show the failover)."""
        if not self._ready():
            raise rejection(503, "CATCHING_UP", "this broker's meta session has lapsed or its routes are behind the "
                            f"log; it {what} again once both are current")

    async def ack(self, group: str, handles: list[Any]) -> list[dict[str, Any]]:
        self._require_ready("acks")
        results = []
        changed: set[tuple[str, int]] = set()
        topics = set()
        decoded = [self.codec.decode(group, raw) for raw in handles]   # each handle's MAC checked once
        self._check_copies([self._verdict(group, h) for h in decoded], "the ack")
        for raw, handle in zip(handles, decoded):
            code, h, st = self._verdict(group, handle)   # again: the same handle twice in one request is acked once
            if code == "":
                st.ack(h.offset)
                self._remember(st.key, h.offset, h.seq, acked=True)
                self.journal.touch(st.key)
                topics.add(h.topic)
                changed.add((h.topic, h.queue))
            if code in ("", "DONE"):
                results.append({"handle": raw, "ok": True})
            else:
                results.append(_code(code, raw))
        if changed:
            await self.journal.durable(confirm=changed)
        for topic in topics:
            self.signals.notify(topic)          # an ordered queue may be free again
        return results

    async def change_invisible(self, group: str, raw: Any, invisible_ms: int) -> str:
        self._require_ready("changes invisible times")
        code, h, st = self._check(group, raw)
        if code == "INVALID_HANDLE":
            raise invalid_handle("not made by this broker for this group, or never delivered")
        if code in ("HANDLE_EXPIRED", "DONE"):
            raise handle_expired("it was acked, delivered again, given a new handle or dead-lettered")
        self._check_copies([(code, h, st)], "the change of invisible time")
        seq = self._next_seq()
        d = st.change_invisible(h.offset, seq, now_ms() + invisible_ms)
        self._schedule(st.key, h.offset, seq, d.deadline_ms)
        # Harmless mutant: acked=None (falsy, as False: _verdict reads it only as a truth value).
        self._remember(st.key, h.offset, h.seq, acked=False)   # superseded
        self.journal.touch(st.key)
        await self.journal.durable(confirm=[(h.topic, h.queue)])
        return self.codec.encode(group, Handle(h.topic, h.queue, h.offset, seq))

    # -- revive and dead letters ---------------------------------------------------------------------------------
    def _fire(self, key: Key, offset: int, seq: int) -> None:
        st = self.states.get(key)
        if st is None:
            return
        # A frozen state's deliveries were handed to the head with their attempts: due here, they go to the head,
        # which dead-letters them itself (dead-lettered here too, the group's DLQ held the message twice)
        verdict = st.expire(offset, seq, now_ms(), None if st.frozen else self.settings.max_attempts(key[0]))
        if verdict == "ready":
            if st.frozen:
                self._hand_over_soon(key)
            self.signals.notify(key[1])
        elif verdict == "dead":
            self.journal.touch(key)
            self._spawn(self._dead_letter(key, offset))

    async def _dead_letter(self, key: Key, offset: int, resumed: bool = False) -> None:
        """Mark (durably), copy to the DLQ (fsynced), remove: a crash between the two last steps is found again on
        restart, where the DLQ's tail says whether the copy was made, so a message goes to the DLQ once."""
        group, topic, queue = key
        st = self.states[key]
        d = st.in_flight.get(offset)
        if d is None or not d.dead:
            return
        if not resumed:
            try:
                await self.journal.durable()
            except ApiError as e:
                # The mark is not known durable (too many waits, or a disk slower than JOURNAL_WAIT_S): the whole
                # chore again later, or this delivery stayed dead in memory, never dead-lettered until a restart.
                # Harmless mutant: None for False (falsy). True is not: the retry would copy an unmarked message.
                await self._dead_letter_later(key, offset, False, "dead_letter_mark_failed", e.code)
                return
        if not (resumed and await asyncio.to_thread(self.dlq.holds, group, topic, queue, offset)):
            try:
                found, gone = await self._read_offsets(topic, queue, [offset])
                code = None if offset in found or offset in gone else "NOT_READ"
            except ApiError as e:
                code = e.code
                if e.code == "TOPIC_NOT_FOUND" and self._ready():
                    found, gone, code = {}, {offset}, None   # the topic was deleted: no message left to keep
            if code is not None:
                await self._dead_letter_later(key, offset, True, "dead_letter_read_failed", code)   # marked durably
                return
            m = found.get(offset)
            if m is not None:
                await self.dlq.append(group, [{"topic": topic, "queue": queue, "origin_offset": offset,
                                               "attempts": d.attempt, "message": m.payload}], now_ms())
                self.dead_lettered += 1
        if st.in_flight.get(offset) is d:
            st.ack(offset)
            # Harmless mutant: acked=None (falsy, as False).
            self._remember(key, offset, d.seq, acked=False)   # dead-lettered
            self.journal.touch(key)
            self.journal.kick()

    async def _dead_letter_later(self, key: Key, offset: int, resumed: bool, event: str, code: str) -> None:
        log.warning(event, key=key, offset=offset, code=code)
        # Harmless mutant: / 1001 (a retry 1 ms sooner).
        await asyncio.sleep(DLQ_RETRY_MS / 1000)
        self._spawn(self._dead_letter(key, offset, resumed=resumed))

    # -- pop state across remaps ---------------------------------------------------------------------------------
    async def _state_for(self, key: Key) -> QueueState | None:
        """The key's state for popping here, taken over from older heads the first time under a new head; None when
        this broker does not hold the queue's decided head (the caller holds the key's lock)."""
        group, topic, queue = key
        head = self.routes.head(topic, queue)   # now, not when the pop began: the queue may have moved meanwhile
        if head is None or head.broker != self.me or head.logic_start is None:
            return None
        st = self.states.get(key)
        if st is not None and st.gen >= head.gen:
            # Frozen at this gen or later: a newer head took the state over; never pop it here again.
            return None if st.frozen else st
        if st is None and len(self.states) >= POP_QUEUES_MAX:
            raise rejection(409, "TOO_MANY_POP_QUEUES", f"this broker keeps pop state of at most {POP_QUEUES_MAX} "
                            "(group, topic, queue)", limit=POP_QUEUES_MAX)
        best: tuple[int, int] | None = (st.gen, st.next_offset) if st is not None else None
        copied: QueueState | None = None   # this broker's copy of a lost leader's state, when it is the newest
        handed: list[list[int]] = []       # the deliveries in flight of best, when an older holder answered it
        held = self.replica.states.get(key)
        held_gen = held.gen if held is not None else None   # logged: what a takeover started from is told
        asked = {self.me}                                 # brokers whose own state is known
        asked_copies: set[tuple[str, int]] = set()        # (broker, gen) asked for a copy of that gen's state
        empty: set[str] = set()                           # brokers that answered holding no state of their own
        settled: set[int] = set()                         # gens under which no pop was acknowledged (_ask_copies)
        history = await self.reader.history(topic, queue)
        for seg in reversed(history):
            if seg.gen >= head.gen or len(asked) > HANDOVER_PEERS_MAX:
                continue
            if best is not None and seg.gen < best[0]:
                # A later gen's state is known: it holds what became of this gen's pops (each takeover adopts the
                # deliveries in flight of the state it starts from, with its answer), so nobody is asked about this
                # one. Asked, an older head that did not answer stopped the takeover (the chaos runner, seed 49:
                # b3, elected with its copy of gen 7, asked gen 5's leader, fenced, and never took over; when b3's
                # disk was lost the copy went with it, and the group started over from offset 0)
                # Harmless mutant: break (gens fall along the reversed history: every segment after this one is
                # older still, and skipped here too).
                continue
            # Harmless mutant: st.gen <= seg.gen (best starts at st's gen and only grows, so with st.gen == seg.gen
            # best[0] < seg.gen fails anyway).
            if seg.broker == self.me and (st is None or st.gen < seg.gen) and (best is None or best[0] < seg.gen):
                # This broker led that gen and holds nothing of it: back on an empty disk, it leads on (a restart
                # with no copy in sync to take over); the copies it waited for hold what it acknowledged (the chaos
                # runner, seed 9: two groups started over from offset 0)
                got = await self._ask_copies(seg, key, asked, asked_copies, empty, settled, best)
                if got is not None and (best is None or got.gen > best[0]):
                    best, copied, handed = (got.gen, got.next_offset), None, got.deliveries
                continue
            if seg.sealer == self.me:
                # A failover elected a copy held here to seal it: that copy was in sync, so this broker's copy of its
                # leader's pop state under this gen holds every ack the leader answered under it (replication/
                # pop_copies.py); the leader, lost, is not asked (the chaos runner, seed 7: b3, elected to seal b2's
                # gen 8, passed it by and started from an older state of its own: 43 acknowledged pops again). With
                # no copy of this gen here, the leader answered no pop under it: its state is of an older gen, and a
                # gen it led is asked of that gen's copies (seed 49: b2, elected to seal b1's gen 3, which b1 had
                # grown into without popping, took its lack of a copy for the answer; gen 2's copies, holding
                # b1's state, were never asked, and the group started over from offset 0)
                asked.add(seg.broker)
                empty.add(seg.broker)
                rep = self.replica.states.get(key)
                if rep is not None and rep.gen == seg.gen and (best is None or rep.gen > best[0]):
                    best, copied = (rep.gen, rep.next_offset), rep
                continue
            if seg.broker in asked:
                if seg.broker in empty and (best is None or best[0] < seg.gen):
                    # Its leader, asked already (for another gen's copy), holds nothing now: this gen's copies hold
                    # what it acknowledged, this broker's own among them (the chaos runner, seed 21: b3, wiped,
                    # answered for gen 13; gen 12, which it had led, was passed by, and b1's copy of it never asked;
                    # then with its own copy of the gen unused: the group started from offset 0 both times)
                    mine = self._copy_here(seg, key)
                    if mine is not None:
                        best, copied = (mine.gen, mine.next_offset), mine
                        continue
                    got = await self._ask_copies(seg, key, asked, asked_copies, empty, settled, best)
                    if got is not None and (best is None or got.gen > best[0]):
                        best, copied, handed = (got.gen, got.next_offset), None, got.deliveries
                continue
            asked.add(seg.broker)
            try:
                got, lost = await self._ask_freeze(seg, key, best), None
                log.info("pop_handover_leader_answered", key=key, leader=seg.broker, gen=seg.gen,
                         found_gen=got.gen if got is not None else None,
                         next_offset=got.next_offset if got is not None else None)
            except ApiError as e:
                if e.code != "BROKER_UNAVAILABLE":
                    raise
                # Its leader does not answer (lost, or cut off): the copies it waited for hold every ack it answered,
                # and a copy refuses a deposed leader's pushes once it knows a newer head, so no ack is answered ok
                # there after this. Waiting for the leader held the takeover back while its copies lost their disks
                # one by one (the chaos runner, seed 63: 29 s, until no holder of gen 7's state was left)
                log.info("pop_handover_leader_unanswered", key=key, leader=seg.broker, gen=seg.gen,
                         why=e.details.get("reason"))
                got, lost = None, e
            if got is None:
                empty.add(seg.broker)
                # Its leader holds nothing (back on an empty disk, maybe) or does not answer: the copies it waited
                # for hold what it acknowledged, this broker's own among them
                mine = self._copy_here(seg, key)
                if mine is not None and (best is None or mine.gen > best[0]):
                    best, copied = (mine.gen, mine.next_offset), mine
                    # Harmless mutant: break (best is this segment's gen now: every older one is skipped above).
                    continue
                got = await self._ask_copies(seg, key, asked, asked_copies, empty, settled, best)
                if got is None and lost is not None and seg.gen not in settled:
                    # No copy holds it, and none the leader waited for says it held them all: the leader's disk may
                    # be the only one that does. Settled, the leader answered no ack under this gen, and the gens
                    # before it are asked (the chaos runner, seed 49, fifth run: b2 was lost before it popped under
                    # gen 4; b1, leading gen 6, waited for it while b1's own gen-3 state was the group's only one
                    # but for b2's copy, lost too, and then lost its own disk: the group started over from 0)
                    raise lost
            # The leader's own answer beats a copy of the same gen's state: the copy is at most as new, and the
            # leader, frozen now, still owns its deliveries in flight (taken from the copy too, they would be
            # delivered again here while an ack there is answered ok: the chaos runner, seed 9)
            # Harmless mutants: != for == and best[1] for best[0] in the last clause: copied is always None here (a
            # copy taken sets best to its segment's gen, and every older segment after it is skipped above), so the
            # clause is never true; it is a guard for an order of segments the history does not give.
            if got is not None and (best is None or got.gen > best[0] or (copied is not None and got.gen == best[0])):
                best, copied, handed = (got.gen, got.next_offset), None, got.deliveries
        if copied is not None:
            self.replica.take(key)
            st = self.states[key] = self._from_copy(copied, st, head.gen)
            self.journal.touch(key)
            await self.journal.durable()
            log.info("pop_state_taken_from_copy", key=key, gen=head.gen, start=st.next_offset,
                     in_flight=len(st.in_flight), copy_gen=held_gen, asked=sorted(asked))
            return st
        if best is None:
            log.info("pop_state_from_queue_start", key=key, gen=head.gen, asked=sorted(asked), empty=sorted(empty),
                     settled=sorted(settled), asked_copies=sorted(asked_copies),
                     gens=[s.gen for s in history])
        start = best[1] if best is not None else await self.reader.min_offset(topic, queue)
        if st is None:
            st = self.states[key] = QueueState(key, start, head.gen)
        else:
            if best[0] > st.gen:
                # A later state holds what became of this broker's deliveries in flight: a failover deposed it (the
                # copy elected took them over; the chaos runner, seed 884: acked pops delivered again once a remap
                # brought the queue back here), or a remap froze it (the head that froze it took them with its answer)
                st.drop_deliveries()
            # Harmless mutant: start always (best[0] == st.gen only while best is still st's own (gen, next_offset),
            # taken under the key's lock, which every move of st's pop offset holds: start is st.next_offset then).
            st.next_offset = max(start, st.next_offset) if best[0] == st.gen else start
            st.gen, st.frozen = head.gen, False
        # The older head's deliveries in flight are this head's from now on, durable here (and on this head's
        # copies) before anything is popped: the older head drops them only once this takeover is (``adopt``)
        adopted = self._adopt_into(st, handed)
        if adopted:
            self.signals.notify(topic)
        self.journal.touch(key)
        await self.journal.durable()
        log.info("pop_state_taken_over", key=key, gen=head.gen, start=st.next_offset, adopted=adopted,
                 from_gen=best[0] if best else None, copy_gen=held_gen, asked=sorted(asked))
        return st

    def _copy_here(self, seg: Segment, key: Key) -> QueueState | None:
        """This broker's copy of ``seg``'s leader's state under ``seg``'s gen, when it held one as a copy the leader
        waited for (in its in-sync set, or elected to seal it)."""
        rep = self.replica.states.get(key)
        if rep is None or rep.gen != seg.gen or (self.me not in seg.in_sync and seg.sealer != self.me):
            return None
        return rep

    def copies_untaken(self, topic: str, queue: int) -> bool:
        """True while this broker leads the queue's decided head and still holds, as a copy, some group's state of it
        that it has not taken over (a takeover is started then). Until it has, no copy may be told the queue's whole
        state: the snapshot would hold less than this broker knows, and a copy elected next would start the group
        over (the chaos runner, seed 9: a queue failed over twice, the second leader never popped it, and every
        acknowledged pop came back from offset 0)."""
        head = self.routes.head(topic, queue)
        if head is None or head.broker != self.me or head.logic_start is None:
            return False
        if not any(k[1] == topic and k[2] == queue for k in self.replica.states):
            return False
        self.take_over_copies_soon()
        return True

    def take_over_copies_soon(self) -> None:
        """Take over, now rather than at a group's next pop, every group's state held here as a copy of a queue
        whose head this broker leads (a failover elected it; route changes call this). Up to TAKEOVER_WORKERS keys
        at once, each on its own: a key whose older head does not answer (its requests take their timeout) holds no
        other back. One pass over every key held them all behind the slowest: the likeliest reading of the chaos
        runner's seed 7, where a queue remapped here was not taken over in the 0.7 s before its copies were wiped.
        A key that could not finish is tried again TAKEOVER_RETRY_S later at the soonest."""
        now = time.monotonic()
        for key in [k for k in self._hinted_here if not self._leads(k[1], k[2])]:
            self._hinted_here.discard(key)     # led elsewhere now: that head is told of it (hint_new_heads)
        for key in [k for k in self._takeover_retry_at if k not in self.replica.states and k not in self._hinted_here]:
            del self._takeover_retry_at[key]   # its copy is gone (taken at a pop, or dropped): nothing to retry
        for key in [*self.replica.states, *self._hinted_here]:
            # Harmless mutants: a default of 1.0 (the monotonic clock is past 1 s on any running broker) and >= (a float
            # boundary: now equal to a retry time to the last bit).
            if key in self._takeover_queued or self._takeover_retry_at.get(key, 0.0) > now \
                    or not self._leads(key[1], key[2]):
                continue
            self._takeover_queued.add(key)
            self._takeovers.append(key)
        while self._takeovers and self._takeover_workers < TAKEOVER_WORKERS:
            self._takeover_workers += 1
            self._spawn(self._take_over_copies())

    async def _take_over_copies(self) -> None:
        try:
            while self._takeovers:
                key = self._takeovers.popleft()
                try:
                    # Not before this broker's session and routes are current: back on an empty disk and not
                    # registered yet, its routes still named it the head of its lost disk's gen; told by a hint, it
                    # took a group over there from an older gen's copy and pushed that state to the gen's copies
                    # over their own, newer one (the chaos runner, seed 49, eighth run: acked pops delivered again)
                    # Harmless mutants: this refusal's words (caught below, where only its code is logged); and the pop
                    # of None for key further down (a retry time left behind is already past: a key is queued again only
                    # once its retry time has come, and the entry is pruned once no copy or hint is left).
                    self._require_ready("takes the pop state over")
                    if (key in self.replica.states or key in self._hinted_here) and self._leads(key[1], key[2]):
                        async with self.locks.hold(key):
                            await self._state_for(key)
                            # Taken over, or this broker's own state decided: either way the copy has served
                            # (kept, it would hold every joining copy out of the in-sync set: copies_untaken)
                            self.replica.take(key)
                    self._hinted_here.discard(key)
                    self._takeover_retry_at.pop(key, None)
                except ApiError as e:   # an older head to ask did not answer: the next route change or gate
                    log.info("pop_takeover_deferred", key=key, code=e.code)
                    if e.code == "TOO_MANY_POP_QUEUES":
                        self._hinted_here.discard(key)   # its first pop here is refused the same way
                    self._takeover_retry_at[key] = time.monotonic() + TAKEOVER_RETRY_S
                    if key in self._hinted_here:
                        self._retry_takeovers_later()   # no gate asks again for a key held as no copy here
                finally:
                    self._takeover_queued.discard(key)
        finally:
            self._takeover_workers -= 1

    def _retry_takeovers_later(self) -> None:
        if not self._takeover_retry_pending:
            self._takeover_retry_pending = True
            self._spawn(self._retry_takeovers())

    async def _retry_takeovers(self) -> None:
        try:
            await asyncio.sleep(TAKEOVER_RETRY_S)
        finally:
            # Harmless mutant: None for False here (falsy, read only as a truth value).
            self._takeover_retry_pending = False
        self.take_over_copies_soon()

    def take_over_soon(self, key: Key) -> None:
        """An older holder of a group's state of a queue this broker leads says it holds one not taken over
        (``hint_new_heads``, ``POST /v1/pop-takeover``): take it over now, as a copy held here is, not at the
        group's first pop here. 409 NOT_LEADER when the queue is not led here."""
        _, topic, queue = key
        self._require_ready("takes the pop state over")
        if not self._leads(topic, queue):
            raise not_leader(topic, queue, self.routes.head(topic, queue))
        if key not in self._hinted_here and len(self._hinted_here) >= POP_QUEUES_MAX:
            raise rejection(409, "TOO_MANY_POP_QUEUES", f"this broker keeps pop state of at most {POP_QUEUES_MAX} "
                            "(group, topic, queue)", limit=POP_QUEUES_MAX)
        self._hinted_here.add(key)
        self.take_over_copies_soon()

    def hint_new_heads(self, topic: str) -> None:
        """Tell the head of each queue of ``topic`` led elsewhere, once per head gen, of every group whose state
        this broker holds of an older gen (its own, not frozen yet, or a copy): the head takes it over at once
        (``take_over_soon``). Taken over only at a group's first pop there, a state stayed on the older gens'
        disks alone while the log moved on, and was lost with them (the chaos runner, seed 49, sixth run: b3, elected
        with its copy of gen 8, was remapped away and failed over from before any pop reached the new heads; when
        b3 lost its disk, the group started over from offset 0). A hint that is not answered is sent again at the
        topic's next route change."""
        if len(self._hinted_heads) > len(self.states) + len(self.replica.states):
            # Keys held no more (taken, dropped): pruned once they could outnumber those held, not at every call
            for key in [k for k in self._hinted_heads if k not in self.states and k not in self.replica.states]:
                del self._hinted_heads[key]
        for key in itertools.chain(self.states, self.replica.states):   # one held both ways is told once (gen)
            if key[1] != topic:
                continue
            head = self.routes.head(topic, key[2])
            if head is None or head.broker == self.me or head.logic_start is None or not head.address \
                    or self._hinted_heads.get(key) == head.gen:
                continue
            own, copy = self.states.get(key), self.replica.states.get(key)
            # Harmless mutants: -2 for either -1 (both fail 0 <= held alike).
            held = max(own.gen if own is not None and not own.frozen else -1, copy.gen if copy is not None else -1)
            if 0 <= held < head.gen:
                self._hinted_heads[key] = head.gen
                self._spawn(self._hint_head(key, head))

    async def _hint_head(self, key: Key, head: Segment) -> None:
        try:
            await self.reader.peers.request("POST", head, _queue_path("pop-takeover", key))
        except ApiError as e:
            log.info("pop_takeover_hint_failed", key=key, head=head.broker, gen=head.gen, code=e.code)
            if self._hinted_heads.get(key) == head.gen:
                del self._hinted_heads[key]

    def _leads(self, topic: str, queue: int) -> bool:
        head = self.routes.head(topic, queue)
        return head is not None and head.broker == self.me and head.logic_start is not None

    def _from_copy(self, copied: QueueState, own: QueueState | None, gen: int) -> QueueState:
        """The state of a lost leader's copy, as this broker's own under the head of ``gen``: its deliveries in flight
        come due here under new numbers, so every handle made for them before is refused, this broker's own among them
        (elected again, it held a copy of its own deliveries: the chaos runner's fixed seed saw an ack of a handle it
        had since superseded answered ok), and they are delivered again once due, at least once; the whole state is
        written to this broker's journal. Deliveries of an older state of its own are dropped: the copy, of a later
        gen, holds what became of them, whether a failover deposed this broker (the copy elected took them over;
        the chaos runner, seed 9: a leader deposed, elected again later, delivered again what the heads between had
        delivered and seen acked) or a remap froze it (the head that froze it adopted them with its answer). Their
        journal lines are removed with this state's first line."""
        st = QueueState(copied.key, copied.next_offset, gen)
        if own is not None:
            own.drop_deliveries()
            st.removed = own.removed   # the journal's lines of own's deliveries precede this state's
            st.moved_below = own.moved_below   # own's handles of what it handed over or dropped stay refused
        for offset, d in sorted(copied.in_flight.items()):
            # Harmless mutants: written None (falsy, as False: read only as a truth value) or True: every delivery is
            # put in dirty below and written by the state's next line; True only adds to that line, for one acked before
            # it (a dead letter of the copy: no handle of these new numbers is out), a removal of an offset no line
            # holds, which a replay ignores (the state on disk is the same).
            st.in_flight[offset] = Delivery(self._next_seq(), d.attempt, d.deadline_ms, False, d.dead)
        for offset, d in sorted(st.in_flight.items()):
            st.dirty.add(offset)
            if d.dead:
                self._spawn(self._dead_letter(st.key, offset, resumed=True))
            else:
                self._schedule(st.key, offset, d.seq, d.deadline_ms)
        return st

    async def receive_copy(self, topic: str, queue: int, leader_gen: int, reset: bool, lines: list[Any]) -> None:
        """A queue's leader pushes its pop journal lines to this copy (replication/pop_copies.py); 409 NOT_LEADER
        when a newer head of the queue is known here (a failover deposed the pusher)."""
        def still_a_copy() -> None:
            head = self.routes.head(topic, queue)
            if head is not None and head.gen > leader_gen:
                raise rejection(409, "NOT_LEADER", f"{topic}/{queue} has a head of gen {head.gen} here, newer than "
                                f"the pushing leader's {leader_gen}", topic=topic, queue=queue, gen=head.gen)
        still_a_copy()
        await self.replica.apply(topic, queue, leader_gen, reset, lines, still_a_copy)

    async def _ask_freeze(self, seg: Segment, key: Key, best: tuple[int, int] | None) -> Found | None:
        """An older head's pop state of ``key``, frozen there first; None when it has none.
        A broker that cannot answer stops the takeover (503 BROKER_UNAVAILABLE): starting without its pop offset
        could deliver twice."""
        body = await self.reader.peers.request("POST", seg, self._handover_path(key, None, best))
        return Found.of(body)

    def _handover_path(self, key: Key, copy_of_gen: int | None = None, best: tuple[int, int] | None = None) -> str:
        """``best``: the (gen, next offset) of the state the asker holds already; an older one is neither frozen
        nor answered (``freeze``'s ``above_gen``)."""
        path = f"{_queue_path('pop-handover', key)}?route_version={self.routes.version}"
        if copy_of_gen is not None:
            path += f"&copy_of_gen={copy_of_gen}"
        return path if best is None else f"{path}&above_gen={best[0]}"

    async def _ask_copies(self, seg: Segment, key: Key, asked: set[str], asked_copies: set[tuple[str, int]],
                          empty: set[str], settled: set[int], best: tuple[int, int] | None) -> Found | None:
        """``seg``'s pop state of ``key`` from a copy of it (its sealer, its in-sync set, then its other replicas),
        frozen there as that broker's own; else the newest older state a copy answered with, its own; None when every
        one answered that it holds none. One of the sealer and the in-sync set that does not answer, while none that
        did holds it, stops the takeover (503
        BROKER_UNAVAILABLE, retried at the next pop): each copy the leader waited for holds every ack it answered,
        and starting from an older state, or from the queue's start, would deliver them again (the chaos runner,
        seed 9: a head cut off from every broker while it took over started from offset 0, and 300 acknowledged
        pops came back).

        A copy of the sealer and the in-sync set whose disk held ``seg`` as its leader or an in-sync copy (its
        answer's ``holds``: broker/offset_witness.py) and that holds no state of ``seg``'s gen settles it: the
        leader answered no ack under it, for it would have waited for this copy. ``seg.gen`` goes into ``settled``,
        and a copy that did not answer no longer stops the takeover. A copy back on an empty disk is named by the
        segment still but holds no mark of it: its "nothing" settles nothing."""
        topic = key[1]
        path = self._handover_path(key, seg.gen, best)
        unanswered: dict[str, str] = {}
        older: Found | None = None   # a copy's own state of an older gen: it is not asked again
        # A broker asked for a later gen's copy may hold a copy of this one: asked again (the chaos runner, seed 9:
        # b2, asked for gen 2's state, held gen 0's copy and was never asked for it; the head started over from 0)
        # The replicas out of sync last: a fence takes a copy out of the in-sync set, not its copy of the state, and
        # a copy held where the leader's acks were refused below min_insync (the chaos runner, seed 49, third run:
        # b3, fenced out of gen 2's set and back on its disk, held b1's state; b1, back on an empty disk, asked
        # gen 2's in-sync set, itself alone, and started the group over from offset 0)
        for copy in dict.fromkeys(b for b in (seg.sealer, *seg.in_sync, *seg.replicas)
                                  if b and b not in (self.me, seg.broker) and (b, seg.gen) not in asked_copies):
            asked_copies.add((copy, seg.gen))
            try:
                body = await self.reader.peers.call("POST", copy, self.routes.address(topic, copy), path)
            except (ApiError, Unreachable) as e:
                why = e.code if isinstance(e, ApiError) else e.reason
                log.info("pop_handover_copy_unanswered", key=key, copy=copy, why=why)
                if copy == seg.sealer or copy in seg.in_sync:   # one out of sync holds no more than they do
                    unanswered[copy] = why
                continue
            # Its own state is in its answer: not asked again as an older gen's leader. Only once it answered: one
            # that did not, marked asked, had a gen it led passed by unasked (the chaos runner, seed 49, fourth run:
            # b3, out of sync for gen 3 and cut off, led gen 2; b2 started from gen 1's state, 127 acked pops again)
            asked.add(copy)
            found = Found.of(body)
            # What each holder answered is what a takeover that started over needs to be traced by (the chaos
            # runner, seed 884: a group started over from offset 0 after four disks were wiped in 50 s)
            log.info("pop_handover_copy_answered", key=key, copy=copy, gen=seg.gen,
                     found_gen=found.gen if found is not None else None,
                     next_offset=found.next_offset if found is not None else None, holds=body.get("holds"))
            # Harmless mutant: <= (a copy holding the gen's state is returned just below, and the settled mark of that
            # gen is read by nothing after: each gen is asked once, and the state found passes every older gen by).
            if found is None or found.gen < seg.gen:
                holds = body.get("holds")
                if (copy == seg.sealer or copy in seg.in_sync) and isinstance(holds, list) \
                        and seg.physical_queue in holds:
                    settled.add(seg.gen)
            if found is None:
                empty.add(copy)   # nothing of its own: a gen it led is asked of that gen's copies
            elif found.gen >= seg.gen:
                return found
            elif older is None or found.gen > older.gen:
                # The copy led an older gen (the chaos runner, seed 9: a queue remapped twice before the second
                # head popped it; the first head, asked here as a copy, was then passed over as an older head
                # already asked, and the third started the group from offset 0)
                older = found
        if unanswered and seg.gen not in settled:
            raise rejection(503, "BROKER_UNAVAILABLE", f"the pop state of queue {key[2]} of {topic!r} under gen "
                            f"{seg.gen} is held by none that answered, and {sorted(unanswered)} did not: starting "
                            "without them could deliver acknowledged pops again", queue=key[2],
                            broker=sorted(unanswered)[0], reason="; ".join(f"{b}: {why}" for b, why in
                                                                         sorted(unanswered.items())))
        return older

    async def freeze(self, key: Key, route_version: int, caller: str | None = None,
                     copy_of_gen: int | None = None, above_gen: int | None = None) -> dict[str, Any]:
        """A new head asks for this broker's pop state of ``key``: once this broker's routes are as new as the
        asker's and it is no longer the head, no pop here can move the pop offset again; freeze it and answer.
        A broker ``caller`` must be the head the log names (None: an admin). With ``copy_of_gen`` the asker wants
        the state of that gen, whose leader holds none, and a copy of it held here becomes this broker's own;
        without, only this broker's own state answers (a copy of a later gen, taken over when the asker asked for
        this broker's own older state, would hand the asker back deliveries it had since seen acked: the chaos
        runner, fixed seed 884)."""
        group, topic, queue = key
        deadline = time.monotonic() + HANDOVER_WAIT_S
        while self.routes.version < route_version:
            # Harmless mutant: >= (a float boundary: the clock equal to the deadline to the last bit).
            if time.monotonic() > deadline:
                raise rejection(503, "CATCHING_UP", "this broker has not seen the route that moved the queue yet")
            await asyncio.sleep(0.02)
        head = self.routes.head(topic, queue)
        require_broker(caller, {head.broker} if head is not None else set(),
                       f"take over the pop state of queue {queue} of {topic!r}: it is not the queue's head")
        if head is not None and head.broker == self.me:
            raise rejection(409, "NOT_LEADER", "this broker holds the queue's head: its pop state is current here")
        # The segments of the queue this disk held as their leader or an in-sync copy: the asker's rule for an
        # answer of no state (``_ask_copies``)
        holds = sorted(self.reader.witness.held(topic, queue))
        try:
            async with self.locks.hold(key, HANDOVER_LOCK_WAIT_S):
                return await self._freeze_held(key, copy_of_gen, above_gen, holds)
        except LockWaitExpired:
            raise rejection(503, "CATCHING_UP", "this broker's pop state of the queue is busy (a pop or a journal "
                            "round); ask again shortly", queue=queue) from None

    async def _freeze_held(self, key: Key, copy_of_gen: int | None, above_gen: int | None,
                           holds: list[str]) -> dict[str, Any]:
        """``freeze`` under the key's lock: this broker's own state of ``key``, frozen, as the answer says."""
        st = self.states.get(key)
        rep = self.replica.states.get(key)
        if rep is not None and rep.gen == copy_of_gen and (st is None or rep.gen > st.gen):
            # A copy of a newer head's state than any led here, asked for because that head's leader holds none:
            # it becomes this broker's own, frozen, and its deliveries in flight go to the head below
            self.replica.take(key)
            st = self.states[key] = self._from_copy(rep, st, rep.gen)
            st.frozen = False
        if st is None or (above_gen is not None and st.gen < above_gen and not st.frozen):
            # Older than the state the asker holds already: it will not start from this one, so this one is not
            # frozen, nor are its deliveries handed over (the chaos runner's fixed seed 884: b1, leading on after
            # a power loss, asked b3 for a copy of a gen it had led itself; b3 froze its own gen-0 state, older
            # than b1's own, and handed over a delivery b1 had since seen acked: delivered again)
            return {"found": False, "holds": holds}
        # One owner per delivery: every one in flight goes to the head now, due or not, in this answer, and its
        # handle is refused here from now on. Kept here until due, they sat on this broker's disk alone: wiped
        # before then, they were never delivered again (the chaos runner, seed 7); copies of this broker's state
        # could not stand in, the head's own copies holding the head's state alone. Handed over only by a push
        # after this answer, they sat on this disk alone until the push got through (the same fault, narrower).
        # They stay here until the head confirms its takeover durable (``_push_expired``).
        was = (st.frozen, st.moved_below)
        st.frozen = True
        st.hand_over_all()
        if (st.frozen, st.moved_below) != was:   # on disk before anything is handed over
            self.journal.touch(key)
            await self.journal.durable()
        self._hand_over_soon(key)
        handed = [[o, st.in_flight[o].attempt, st.in_flight[o].deadline_ms] for o in st.ready if o in st.in_flight]
        return {"found": True, "in_flight": len(st.in_flight), "holds": holds,
                **Found(st.gen, st.next_offset, handed)._asdict()}

    def _hand_over_soon(self, key: Key) -> None:
        if key not in self._handing:
            self._handing.add(key)
            self._spawn(self._hand_over_expired(key))

    async def _hand_over_expired(self, key: Key) -> None:
        try:
            while not await self._push_expired(key):
                # Harmless mutant: / 1001 (asked again 1 ms sooner).
                await asyncio.sleep(DLQ_RETRY_MS / 1000)
        finally:
            self._handing.discard(key)

    async def _push_expired(self, key: Key) -> bool:
        """Asks the current head (``pop-adopt``, with no deliveries) whether its takeover of a frozen key is durable;
        once it answers, this broker drops every delivery it handed over (``ready``: all of them once frozen, due or
        not). The head took them from this broker's answer to ``freeze``, or from a later state that had them, so
        the question carries none. False when it should be asked again later."""
        st = self.states.get(key)
        if st is None or not st.frozen or not st.ready:
            return True
        _, topic, queue = key
        head = self.routes.head(topic, queue)
        if head is not None and head.broker == self.me:
            return True            # the head came back here: the next pop takes the state over, ready ones first
        if head is None or not head.address:
            return False           # routes not followed yet after a restart, or no address: try again shortly
        handed = {o: st.in_flight[o] for o in st.ready if o in st.in_flight}
        try:
            await self.reader.peers.request("POST", head, _queue_path("pop-adopt", key), {"deliveries": []})
        except ApiError as e:
            log.info("pop_handover_failed", key=key, code=e.code)
            return False
        for o, d in handed.items():
            if st.in_flight.get(o) is d:
                st.ack(o)
                # Harmless mutants: None for key or for o, acked=None: a handle of a delivery handed over is
                # HANDLE_EXPIRED without its remembered outcome (frozen, moved_below is at least the pop offset:
                # _verdict), and None is falsy.
                self._remember(key, o, d.seq, acked=False)   # moved to the head
        self.journal.touch(key)
        await self.journal.durable()
        return not st.ready

    async def adopt(self, key: Key, deliveries: list[list[int]], caller: str | None = None) -> int:
        """Deliveries of an older head ([offset, attempt] due now, or [offset, attempt, deadline_ms]). From an
        admin (``caller`` None): delivered again from here once due, before anything new. From a broker, which must
        be one the log names as a holder of an older gen of the queue (its leader, a copy, its sealer): a frozen
        older head asking whether this head's takeover is durable; it is once this returns, and that takeover
        adopted them already, from the older head's answer to ``freeze`` or from a later state that had, so none is
        taken here (taken again, one acked here since would be delivered again). A copy hands over too: asked for
        the state of a gen whose leader held none, it made its copy its own (``freeze``); refused, its deliveries in
        flight sat on its disk alone (the chaos runner, seed 7: 403, then that broker was wiped, and a popped
        message never came back)."""
        group, topic, queue = key
        head = self.routes.head(topic, queue)
        if head is None or head.broker != self.me:
            raise not_leader(topic, queue, head)
        if caller is not None:
            older = {b for seg in await self.reader.history(topic, queue) if seg.gen < head.gen
                     for b in (seg.broker, seg.sealer, *seg.replicas) if b}
            require_broker(caller, older | {self.me},
                           f"hand over deliveries of queue {queue} of {topic!r}: it never held an older gen of it")
        async with self.locks.hold(key):
            st = await self._state_for(key)
            if st is None:
                raise not_leader(topic, queue, self.routes.head(topic, queue))
            taken = self._adopt_into(st, deliveries if caller is None else [])
            self.journal.touch(key)
            await self.journal.durable()
        if taken:
            self.signals.notify(topic)
        return taken

    def _adopt_into(self, st: QueueState, deliveries: list[list[int]]) -> int:
        """Older deliveries ([offset, attempt] due now, or [offset, attempt, deadline_ms]) in flight in ``st``,
        scheduled; none already in flight here or at or past its pop offset. The caller makes the state durable."""
        now = now_ms()
        taken = 0
        for offset, attempt, *deadline in deliveries:
            if offset in st.in_flight or offset >= st.next_offset:
                continue
            # Harmless mutant: 1 for 0 (due now either way: the deadline becomes max(now, 1) = now and is ready).
            d = st.adopt(offset, self._next_seq(), attempt, now, deadline[0] if deadline else 0)
            if offset not in st.ready:
                self._schedule(st.key, offset, d.seq, d.deadline_ms)
            taken += 1
        return taken

    # -- what operators see --------------------------------------------------------------------------------------
    def stats(self, group: str | None = None) -> list[dict[str, Any]]:
        now = now_ms()
        out = []
        for (g, t, q), st in sorted(self.states.items()):
            if group is not None and g != group:
                continue
            out.append({"group": g, "topic": t, "queue": q, "pop_offset": st.next_offset,
                        "in_flight": len(st.in_flight), "invisible": st.invisible_count(now),
                        "revive_backlog": len(st.ready) + sum(1 for d in st.in_flight.values() if d.dead),
                        "frozen": st.frozen, "gen": st.gen})
        return out
