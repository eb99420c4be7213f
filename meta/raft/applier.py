"""The state machine's own thread: the raft tick hands it committed entries and never waits for an apply.

pysyncobj applies committed entries on its tick thread, the thread that also answers heartbeats and votes: a tick
that applied a batch of large commands held heartbeats back past the election timeout (measured: ticks of 0.3-0.5 s
and elections while 8 writers proposed 0.5 MiB commands; the apply of one such envelope costs ~8 ms in json).
etcd's raft leaves apply to the application for this reason (the application applies ``Ready.CommittedEntries``
while the node goes on ticking). Here pysyncobj's apply hook only queues each committed entry (``submit``) and
hands pysyncobj a ``Pending`` as the command's result; a proposer's callback waits on it (``Pending.then``).

Most entries are small commands whose apply costs tens of microseconds (a topic's config, a group's settings, an
offset budget): handing each to the apply thread cost more than applying it, a thread wake-up and the GIL passed
back and forth, on the path of every write. Those are queued ``inline``: the apply thread is not woken for them, and
the tick applies them itself (``run_inline``) right after it sent the commit index on, unless the apply
thread holds work already (then it takes them too, in order). An entry of another kind, or a call, wakes the thread.

Entries are applied strictly in log order, one at a time. Work that must see the image exactly at an index (the
snapshot writer's fork) is queued behind that index (``submit_call``). A snapshot installed from the leader replaces
the image: the entries it covers that are still queued are dropped (``discard_through``) and their proposers learn
that the outcome is unknown (the image has them, the answer is lost: a retry with the same request id finds it).
The queue is bounded by what pysyncobj commits, itself bounded by its command queue and the log.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any

import structlog

log = structlog.get_logger("meta.raft")

STOP_WAIT_S = 10.0
# The most entries the tick applies at once (run_inline). A node catching up (restarted, or back from a partition)
# has thousands committed at once, and applying them all in one tick held it, and the event loop it runs on, for
# 1-2 s (raft_tick_slow in the vs_etcd bench's failovers); past this many the apply thread takes the batch.
INLINE_ENTRIES_MAX = 64
DISCARDED = object()   # the outcome of an entry a snapshot install covered before it was applied here


class Pending:
    """The outcome of one committed entry, once the apply thread got to it."""

    __slots__ = ("index", "outcome", "_waiters", "_done")

    def __init__(self, index: int):
        self.index = index
        self.outcome: Any = None
        self._waiters: list[Callable[[Any], None]] = []
        self._done = False

    def then(self, waiter: Callable[[Any], None], lock: threading.Lock) -> None:
        """Call ``waiter(outcome)`` once the entry is applied (at once if it already is), on the applying thread."""
        with lock:
            if not self._done:
                self._waiters.append(waiter)
                return
        waiter(self.outcome)

    def _resolve(self, outcome: Any, lock: threading.Lock) -> None:
        with lock:
            self.outcome, self._done = outcome, True
            waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            waiter(outcome)


class Applier:
    def __init__(self, apply: Callable[[int, bytes | None], Any], after_batch: Callable[[], None]):
        self._apply = apply                # (index, envelope bytes or None for a no-op) -> outcome; apply thread
        self._after_batch = after_batch    # e.g. the loop bridge's flush: answers leave once per batch
        self._cond = threading.Condition()
        self._queue: deque[tuple[Pending | None, int, Any]] = deque()
        self.lock = threading.Lock()       # the Pendings' state
        self._stopping = False
        self._busy = False
        self._woken = False                # the apply thread was woken for what is queued: run_inline leaves it
        self.applied_index = 0             # the last index whose apply finished (or was dropped by an install)
        self._thread = threading.Thread(target=self._run, name="raft-apply", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, index: int, payload: Any, inline: bool = False) -> Pending:
        """The tick: queue committed entry ``index``; returns what its proposers wait on. ``inline``: its apply
        is cheap, the tick's next ``run_inline`` may apply it."""
        pending = Pending(index)
        with self._cond:
            self._queue.append((pending, index, payload))
            if not inline:
                self._wake()
        return pending

    def submit_call(self, call: Callable[[], None]) -> None:
        """Run ``call`` on the apply thread after every entry queued so far was applied."""
        with self._cond:
            self._queue.append((None, 0, call))
            self._wake()

    def _wake(self) -> None:   # under self._cond
        self._woken = True
        self._cond.notify()

    def run_inline(self, image_lock: threading.RLock) -> None:
        """The tick: apply what is queued now, if every item of it was queued ``inline`` and the apply thread is
        not at work and there are at most INLINE_ENTRIES_MAX items; else leave it to the thread, which was woken for
        it or takes it after its current batch.
        ``image_lock`` (the one apply takes) is only tried: a reader holding it (a large route rendered on a worker
        thread) must not hold the tick, so then the thread is woken for the batch instead."""
        with self._cond:
            if self._busy or self._woken or not self._queue:
                return
            if len(self._queue) > INLINE_ENTRIES_MAX or not image_lock.acquire(blocking=False):
                self._wake()
                return
            batch, self._queue = self._queue, deque()
            self._busy = True
        try:
            self._run_batch(batch)
        finally:
            image_lock.release()

    def discard_through(self, index: int) -> int:
        """The tick, before a snapshot of ``index`` replaces the image: drop the queued entries it covers."""
        dropped: list[Pending] = []
        with self._cond:
            kept: deque[tuple[Pending | None, int, Any]] = deque()
            for item in self._queue:
                if item[0] is not None and item[1] <= index:
                    dropped.append(item[0])
                else:
                    kept.append(item)
            self._queue = kept
            self.applied_index = max(self.applied_index, index)
        for pending in dropped:
            pending._resolve(DISCARDED, self.lock)
        return len(dropped)

    def idle(self) -> bool:
        with self._cond:
            return not self._queue and not self._busy

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(STOP_WAIT_S)

    def run_pending(self) -> None:
        """Apply what is queued now, on the caller's thread, and return: one pass of the apply thread, for a caller
        that drives the node itself (ops/sim) instead of starting the thread."""
        batch = self._take(wait=False)
        if batch is not None:
            self._run_batch(batch)

    def _run(self) -> None:
        while (batch := self._take(wait=True)) is not None:
            self._run_batch(batch)

    def _take(self, wait: bool) -> deque[tuple[Pending | None, int, Any]] | None:
        """The queued batch, marked busy; None when there is none (``wait``: once stopping with nothing left)."""
        with self._cond:
            # busy: the tick applies a batch of its own (run_inline); one apply at a time, in log order
            while wait and (not self._queue or self._busy) and not self._stopping:
                self._cond.wait()
            if not self._queue:
                return None   # nothing queued (and, waiting, stopping)
            batch, self._queue = self._queue, deque()
            self._busy, self._woken = True, False
            return batch

    def _run_batch(self, batch: deque[tuple[Pending | None, int, Any]]) -> None:
        try:
            for pending, index, work in batch:
                if pending is None:
                    try:
                        work()
                    except Exception:   # noqa: BLE001 - a failed call must not stop every later apply
                        log.exception("raft_apply_call_failed")
                    continue
                outcome = self._apply(index, work)
                with self._cond:
                    self.applied_index = max(self.applied_index, index)
                pending._resolve(outcome, self.lock)
        finally:
            with self._cond:
                self._busy = False
                if self._woken:   # queued for the thread while the tick applied
                    self._cond.notify()
            self._after_batch()
