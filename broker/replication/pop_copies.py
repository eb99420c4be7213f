"""Pop state on every copy of a queue's head, with the rule the records follow (issue 37): the pop journal's round
that makes an ack or a change of invisible time durable (broker/pop/journal.py) also brings the lines it writes to
every copy the leader waits for, and the ack is answered only once they hold them, so the copy a failover elects
never delivers an acknowledged pop again (it takes the state over: broker/pop/service.py ``_state_for``).

- Each round, the lines of each queue this broker leads go to its copies (``PUT /v1/replica/pop``; the copy keeps
  them apart, broker/pop/replica.py), one push per queue and copy, every push of a round awaited before the next
  round starts, so a copy applies them in order. A copy waited for (``ReplicaTracker.waited_for``) is asked again
  until it holds them, leaves the set (the round's acks are answered 503 REPLICATION_UNCONFIRMED when that leaves
  fewer copies in sync than min_insync), or REPLICATION_WAIT_S passes (the same answer); a copy that missed a
  round gets the queue's whole state (a *snapshot*) at the next one,
  before any other line, since a delta line only adds and removes.
- A copy outside the in-sync set gets nothing. Before the leader asks meta to add it (``ready``, which the tracker
  asks first), it gets a snapshot at the next round and every round after; it is ready once the snapshot is stored
  and no push to it failed since (a failed one makes it unready: a snapshot again). Pushes to such a copy do not
  hold the round's acks; a slow one holds the round at most PEER_REQUEST_TIMEOUT_S, once. A leader a failover
  elected first takes over every group's state it holds of the queue as a copy (``untaken``: service.py
  ``copies_untaken``), so the snapshot holds what the lost leader acknowledged even when no group popped here yet.
- A copy refuses a push from the leader of a gen older than the head it knows (409 NOT_LEADER).
Pops themselves are not replicated beyond what the journal writes of them: a first delivery is written (and so
copied) once it is 400 ms old; one popped later than that before a failover is delivered again (at least once).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import structlog

from wire.errors import ApiError

from ..peers import Peers, Unreachable
from ..pop.state import Key, QueueState
from ..routing import RouteTable, Segment
from .leader import REPLICATION_WAIT_S, ReplicaTracker, unconfirmed

log = structlog.get_logger("broker.replication")

PATH = "/v1/replica/pop"
PUSH_RETRY_S = 0.1
LINES_PER_PUSH_MAX = 100_000      # a snapshot of a queue holds one line per group that pops it

Line = list[Any]


class Push:
    """One push of a round: ``lines`` of ``seg``'s queue to ``copy``; ``reset``: a snapshot."""

    def __init__(self, seg: Segment, copy: str, lines: list[Line], reset: bool, waited: bool):
        self.seg, self.copy, self.lines, self.reset, self.waited = seg, copy, lines, reset, waited

    def body(self) -> dict[str, Any]:
        return {"topic": self.seg.topic, "queue": self.seg.queue, "leader_gen": self.seg.gen, "reset": self.reset,
                "lines": self.lines}


class PopCopies:
    def __init__(self, me: str, routes: RouteTable, tracker: ReplicaTracker, peers: Peers):
        self.me = me
        self.routes = routes
        self.tracker = tracker
        self.peers = peers
        self.kick: Callable[[], None] = lambda: None      # runs the journal's next round soon
        # True while the pop state this broker holds of a queue as a copy is not taken over yet (it then starts it)
        self.untaken: Callable[[str, int], bool] = lambda topic, queue: False
        self._pushed: dict[str, set[str]] = {}     # pq -> copies not waited for that get every round
        self._ready: dict[str, set[str]] = {}      # pq -> of those, the ones holding the queue's whole state
        self._snapshot: dict[str, set[str]] = {}   # pq -> copies to send the queue's whole state at the next round

    # -- the tracker's gate -------------------------------------------------------------------------------------
    def ready(self, seg: Segment, copy: str) -> bool:
        pq = seg.physical_queue
        if copy in self._ready.get(pq, ()):
            return True
        if self.untaken(seg.topic, seg.queue):
            return False   # the state this broker holds of the queue as a copy goes into the snapshot: taken first
        if copy not in self._snapshot.get(pq, ()):
            self._pushed.setdefault(pq, set()).add(copy)
            self._snapshot.setdefault(pq, set()).add(copy)
            self.kick()
        return False

    # -- a round ------------------------------------------------------------------------------------------------
    def collect(self, states: dict[Key, QueueState], written: list[Line],
                now_ms: int) -> tuple[list[Line], list[Push], set[tuple[str, int]]]:
        """Called by the journal's round with the lines it is about to write, before any await: the lines a
        snapshot adds to them (each key of a snapshot's queue brought up to date first), the round's pushes, and
        the queues whose lines go to no copy because their head moved away from here (``stranded``): an ack among
        them is on this disk alone, and must not be answered ok (Journal.durable's ``confirm``)."""
        extra: list[Line] = []
        full: dict[str, list[Line]] = {}
        for pq, copies in list(self._snapshot.items()):
            seg = self._led(pq)
            if seg is None:
                continue
            queue_lines = []
            for key, st in states.items():
                if key[1] == seg.topic and key[2] == seg.queue:
                    line = st.take_line(now_ms, force=True)
                    if line is not None:
                        extra.append(line)
                    queue_lines.append(st.full_line())
            full[pq] = queue_lines[:LINES_PER_PUSH_MAX]
        snapshots, self._snapshot = self._snapshot, {}
        by_queue: dict[tuple[str, int], list[Line]] = {}
        for line in [*written, *extra]:
            by_queue.setdefault((line[1], line[2]), []).append(line)
        pushes = []
        stranded: set[tuple[str, int]] = set()
        for (topic, queue), lines in by_queue.items():
            seg = self.routes.head(topic, queue)
            if seg is None or self._led(seg.physical_queue) is None:
                stranded.add((topic, queue))   # a frozen state of a queue that moved on: its lines stay here
                continue
            pq = seg.physical_queue
            waited = self.tracker.waited_for(seg)
            for copy in sorted((waited | self._pushed.get(pq, set())) - snapshots.get(pq, set()) - {self.me}):
                pushes.append(Push(seg, copy, lines, False, copy in waited))
        for pq, copies in snapshots.items():
            seg = self._led(pq)
            if seg is None:
                continue
            waited = self.tracker.waited_for(seg)
            for copy in sorted(copies - {self.me}):
                pushes.append(Push(seg, copy, full.get(pq, []), True, copy in waited))
        return extra, pushes, stranded

    def _led(self, pq: str) -> Segment | None:
        seg = self.routes.hosted.get(pq)
        return seg if seg is not None and seg.state == "active" and seg.broker == self.me else None

    async def push(self, pushes: list[Push]) -> None:
        """Every push of a round, at once; raises when a copy waited for did not take its lines."""
        results = await asyncio.gather(*(self._push(p) for p in pushes), return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                raise r

    async def _push(self, p: Push) -> None:
        pq = p.seg.physical_queue
        deadline = time.monotonic() + REPLICATION_WAIT_S
        while True:
            try:
                await self.peers.call("PUT", p.copy, self.routes.address(p.seg.topic, p.copy), PATH, p.body())
                if p.reset and p.copy in self._pushed.get(pq, ()):
                    self._ready.setdefault(pq, set()).add(p.copy)
                return
            except (ApiError, Unreachable) as e:
                why = e.code if isinstance(e, ApiError) else e.reason
            now = self._led(pq)
            if now is None:
                if p.waited:
                    # The head moved on (a remap, or a failover that may elect this very copy): what the round
                    # holds, an ack among it, is in doubt, never ok. The chaos runner, seed 7: b1 answered acks ok
                    # just after a remap moved the queue off it, its push to b2 given up; b1 was wiped before any
                    # new head asked it, and b2 took the group over from its copy, without the acks, later
                    raise unconfirmed(p.seg, f"the queue's head moved on before copy {p.copy} stored the pop "
                                             f"state ({why})", "the pop state is")
                return
            if p.copy not in self.tracker.waited_for(now):
                self._unready(pq, p.copy)
                if p.waited:
                    self.tracker.still_enough(now, "the pop state is")
                return
            if time.monotonic() > deadline:
                self._snapshot.setdefault(pq, set()).add(p.copy)   # it may have missed this round
                raise unconfirmed(p.seg, f"copy {p.copy} did not store the pop state within "
                                         f"{REPLICATION_WAIT_S:.0f} s ({why})", "the pop state is")
            await asyncio.sleep(PUSH_RETRY_S)

    def resync(self) -> None:
        """Every copy of every queue led here gets the queue's whole state at the next round (the journal was
        compacted: what that brought up to date went nowhere else)."""
        for pq, seg in list(self.routes.hosted.items()):
            if self._led(pq) is not None:
                copies = (self.tracker.waited_for(seg) | self._pushed.get(pq, set())) - {self.me}
                if copies:
                    self._snapshot.setdefault(pq, set()).update(copies)
        self.kick()

    def forget_copy(self, copy: str) -> None:
        """``copy`` registered again (a new disk, maybe): every queue's state goes to it afresh, snapshot first."""
        for pq in {*self._pushed, *self._ready, *self._snapshot}:
            self._unready(pq, copy)

    def _unready(self, pq: str, copy: str) -> None:
        self._pushed.get(pq, set()).discard(copy)
        self._ready.get(pq, set()).discard(copy)
        self._snapshot.get(pq, set()).discard(copy)

    def route_changed(self) -> None:
        for pq in {*self._pushed, *self._ready, *self._snapshot}:
            if self._led(pq) is None:
                for table in (self._pushed, self._ready, self._snapshot):
                    table.pop(pq, None)
