"""Pop state of one (group, topic, logic queue), pure: no clock (times come in), no I/O, no asyncio.

``next_offset`` is the pop offset: every logic offset below it was handed out at least once; ``in_flight`` holds the
deliveries not acked yet (offset -> seq, attempt, deadline). A delivery whose deadline passed is *ready*: it goes out
again, before anything new, with ``attempt`` + 1, or to the dead-letter queue after the group's max attempts.

What is durable (journal.py) is described by the lines ``take_line`` hands out, which always keep this rule: the
written pop offset never passes an offset whose delivery is neither written nor acked, so a crash can only bring a
message back, never lose one. A first delivery is written only once it is DELIVERY_WRITE_DELAY_MS old; an ack before
that removes it from memory and nothing is ever written for the pair (an ack is answered only once the written pop
offset has passed it: unacked deliveries below an acked one are written at once for that).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from .limits import DELIVERY_WRITE_DELAY_MS

Key = tuple[str, str, int]   # group, topic, queue

# Outcomes of checking a handle against the state.
LIVE, EXPIRED, UNKNOWN, DONE = "live", "expired", "unknown", "done"


@dataclass
class Delivery:
    seq: int
    attempt: int
    deadline_ms: int
    written: bool = False      # some version of this offset's record is in the journal (an ack must remove it)
    dead: bool = False         # past max attempts: on its way to the dead-letter queue


@dataclass
class QueueState:
    key: Key
    next_offset: int
    gen: int = 0               # the head segment's gen this state was popped under (pop across remaps)
    frozen: bool = False       # the head moved on: no more pops here, in-flight deliveries stay ackable
    # Offsets below it may have left this state unacked: handed to a newer head (frozen), or dropped for the copy a
    # failover elected. A handle of one no longer in flight is done here only if the service remembers its ack.
    moved_below: int = 0
    in_flight: dict[int, Delivery] = field(default_factory=dict)
    ready: dict[int, None] = field(default_factory=dict)       # expired offsets in expiry order
    # Journal bookkeeping.
    fresh: deque = field(default_factory=deque)                # (popped_ms, offset, seq) first deliveries unwritten
    dirty: set[int] = field(default_factory=set)               # offsets whose record must be (re)written
    removed: set[int] = field(default_factory=set)             # written offsets acked or dead-lettered since
    ack_horizon: int = 0                                       # an ack of an unwritten delivery below this
    written_next: int | None = None
    written_meta: tuple[int, bool, int] | None = None          # (gen, frozen, moved_below) as last written

    # -- handing out ---------------------------------------------------------------------------------------------
    def deliver_new(self, offset: int, seq: int, now_ms: int, invisible_ms: int) -> Delivery:
        # Harmless mutant: or for and (an assertion that holds on every reachable state: _adopt_into keeps in flight
        # only offsets below the pop offset; weakened, it changes nothing).
        assert offset >= self.next_offset and offset not in self.in_flight
        d = self.in_flight[offset] = Delivery(seq, 1, now_ms + invisible_ms)
        self.fresh.append((now_ms, offset, seq))
        self.next_offset = offset + 1
        return d

    def skip_to(self, offset: int) -> None:
        """Nothing to hand out below ``offset`` (a gap of a dead broker's budget, or retention)."""
        self.next_offset = max(self.next_offset, offset)

    def redeliver(self, offset: int, seq: int, now_ms: int, invisible_ms: int) -> Delivery:
        # Harmless mutant: pop without its default (_redeliver passes only offsets in ready).
        old = self.in_flight[offset]
        self.ready.pop(offset, None)
        d = self.in_flight[offset] = Delivery(seq, old.attempt + 1, now_ms + invisible_ms, old.written)
        self.dirty.add(offset)
        return d

    # Harmless mutants: a default deadline of 1 (every caller passes one; 1 <= now_ms anyway), and "" for None as a
    # value of ready here, in hand_over_all and in expire (ready is an ordered set: its values are never read).
    def adopt(self, offset: int, seq: int, attempt: int, now_ms: int, deadline_ms: int = 0) -> Delivery:
        """A delivery handed over by an older head (pop across remaps), written at once: in flight until
        ``deadline_ms``, ready at once when that has passed."""
        d = self.in_flight[offset] = Delivery(seq, attempt, max(now_ms, deadline_ms))
        if deadline_ms <= now_ms:
            self.ready[offset] = None
        self.dirty.add(offset)
        return d

    def hand_over_all(self) -> None:
        """Frozen: every delivery in flight here goes to the head now, due or not (``ready`` holds what is to be
        handed over), and its handle is refused here from now on (service.py ``_verdict``)."""
        self.moved_below = max(self.moved_below, self.next_offset)
        for offset, d in self.in_flight.items():
            if not d.dead:
                self.ready[offset] = None

    # -- handles ---------------------------------------------------------------------------------------------------
    def check(self, offset: int, seq: int) -> str:
        d = self.in_flight.get(offset)
        if d is None:
            return DONE if offset < self.next_offset else UNKNOWN
        if d.seq == seq:
            return EXPIRED if d.dead else LIVE
        # Harmless mutant: >= (d.seq == seq returned above).
        return EXPIRED if d.seq > seq else UNKNOWN

    def ack(self, offset: int) -> None:
        d = self.in_flight.pop(offset)
        self.ready.pop(offset, None)
        self.dirty.discard(offset)
        if d.written:
            self.removed.add(offset)
        else:
            # Durable only once the written pop offset passes it, so the unacked deliveries below it must be
            # written now (acks of whole batches, the usual case, leave none: then nothing is written at all).
            self.ack_horizon = max(self.ack_horizon, offset + 1)

    def drop_deliveries(self) -> None:
        """Forget every delivery in flight: another head took them over (a failover deposed this one). The written
        ones are removed by the next line, or a replay would bring them back."""
        self.moved_below = max(self.moved_below, self.next_offset)
        self.removed.update(o for o, d in self.in_flight.items() if d.written)
        self.in_flight.clear()
        self.ready.clear()
        self.dirty.clear()

    def change_invisible(self, offset: int, seq: int, deadline_ms: int) -> Delivery:
        old = self.in_flight[offset]
        self.ready.pop(offset, None)
        d = self.in_flight[offset] = Delivery(seq, old.attempt, deadline_ms, old.written)
        self.dirty.add(offset)
        return d

    # -- the revive scanner ----------------------------------------------------------------------------------------
    def expire(self, offset: int, seq: int, now_ms: int, max_attempts: int | None) -> str | None:
        """At a deadline: "ready" (deliver again), "dead" (to the DLQ) or None (acked or superseded meanwhile).
        ``max_attempts`` None: never dead here (a frozen state's deliveries are the head's to dead-letter)."""
        d = self.in_flight.get(offset)
        if d is None or d.seq != seq or d.deadline_ms > now_ms or d.dead:
            return None
        if max_attempts is not None and d.attempt >= max_attempts:
            d.dead = True
            self.ready.pop(offset, None)
            self.dirty.add(offset)
            return "dead"
        self.ready[offset] = None
        return "ready"

    def invisible_count(self, now_ms: int) -> int:
        return sum(1 for d in self.in_flight.values() if d.deadline_ms > now_ms and not d.dead)

    def blocked(self, now_ms: int) -> bool:
        """Ordered pop: a batch is out while any of its messages is invisible and unacked."""
        return any(d.deadline_ms > now_ms and not d.dead for d in self.in_flight.values())

    # -- the journal -----------------------------------------------------------------------------------------------
    def take_line(self, now_ms: int, force: bool = False) -> list[Any] | None:
        """The journal line bringing the written state up to date, or None when nothing needs writing; marks what it
        holds as written. First deliveries younger than DELIVERY_WRITE_DELAY_MS stay out (unless ``force``), and
        so does the pop offset past the first of them."""
        while self.fresh:
            popped_ms, offset, seq = self.fresh[0]
            d = self.in_flight.get(offset)
            if d is None or d.seq != seq:
                self.fresh.popleft()          # acked (the pair cancels) or superseded by a dirty record
            elif force or now_ms - popped_ms >= DELIVERY_WRITE_DELAY_MS or offset < self.ack_horizon:
                self.fresh.popleft()
                self.dirty.add(offset)
            else:
                break
        if self.written_meta is not None and self.written_meta[0] != self.gen:
            # The first line under a gen is whole, every written delivery in it: a copy replaces what it held of the
            # key with it (pop/replica.py)
            self.dirty.update(o for o, d in self.in_flight.items() if d.written)
        # An offset dropped and then taken in flight again before this line (a takeover of a later state that
        # adopted this state's own deliveries, or a copy's) is written as its new record only: the replay applies
        # removals after upserts, and with both it lost the delivery (the chaos runner, seed 6)
        self.removed -= self.dirty
        durable_next = min(self.next_offset, self.fresh[0][1]) if self.fresh else self.next_offset
        meta = (self.gen, self.frozen, self.moved_below)
        if not self.dirty and not self.removed and durable_next == self.written_next and meta == self.written_meta:
            return None
        upserts = []
        for offset in sorted(self.dirty):
            d = self.in_flight[offset]
            d.written = True
            upserts.append([offset, d.seq, d.attempt, d.deadline_ms, 1 if d.dead else 0])
        line = [*self.key, durable_next, self.gen, self.frozen, self.moved_below, upserts, sorted(self.removed)]
        self.dirty.clear()
        self.removed.clear()
        self.written_next, self.written_meta = durable_next, meta
        return line

    def full_line(self) -> list[Any]:
        """Everything durable about this key, for a compacted journal (call right after ``take_line(force=True)``)."""
        upserts = [[o, d.seq, d.attempt, d.deadline_ms, 1 if d.dead else 0]
                   for o, d in sorted(self.in_flight.items()) if d.written]
        return [*self.key, self.written_next, self.gen, self.frozen, self.moved_below, upserts, []]


class OlderFormatLine(ValueError):
    """A line of Stator 0.1's pop journal: 8 fields, without moved_below. Before 1.0 there is no upgrade path; the
    file is refused by name (storage/errors.py UnsupportedFormat), never read as damage."""


def replay_line(states: dict[Key, QueueState], line: Any) -> QueueState:
    """Apply one journal line (ValueError/TypeError/KeyError for a garbled one, before changing anything)."""
    if isinstance(line, list) and len(line) == 8:
        raise OlderFormatLine("a pop journal line of Stator 0.1 (8 fields; this build writes 9, with moved_below)")
    g, t, q, next_offset, gen, frozen, moved_below, upserts, removes = line
    if not (isinstance(g, str) and isinstance(t, str) and type(q) is int and type(next_offset) is int
            and type(gen) is int and isinstance(frozen, bool) and type(moved_below) is int):
        # Harmless mutants: this error's words (every caller catches it and says what it was told in words of its own).
        raise ValueError("bad journal line")
    parsed = [(int(o), Delivery(int(s), int(a), int(dl), True, bool(dead))) for o, s, a, dl, dead in upserts]
    removes = [int(o) for o in removes]
    key = (g, t, q)
    st = states.get(key)
    if st is None:
        # Harmless mutant: None for next_offset (set on the next line).
        st = states[key] = QueueState(key, next_offset)
    st.next_offset, st.gen, st.frozen, st.moved_below = next_offset, gen, frozen, moved_below
    st.written_next, st.written_meta = next_offset, (gen, frozen, moved_below)
    for o, d in parsed:
        st.in_flight[o] = d
    for o in removes:
        st.in_flight.pop(o, None)
    return st
