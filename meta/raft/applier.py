"""The state machine's own thread: the raft tick thread hands it committed entries and never waits for an apply.

pysyncobj applies committed entries on its tick thread, the thread that also answers heartbeats and votes: a tick
that applied a batch of large commands held heartbeats back past the election timeout (measured: ticks of 0.3-0.5 s
and elections while 8 writers proposed 0.5 MiB commands; the apply of one such envelope costs ~8 ms in json).
etcd's raft leaves apply to the application for this reason (the application applies ``Ready.CommittedEntries``
while the node goes on ticking). Here pysyncobj's apply hook only queues each committed entry (``submit``) and
hands pysyncobj a ``Pending`` as the command's result; a proposer's callback waits on it (``Pending.then``).

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
        self.applied_index = 0             # the last index whose apply finished (or was dropped by an install)
        self._thread = threading.Thread(target=self._run, name="raft-apply", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, index: int, payload: bytes | None) -> Pending:
        """Tick thread: queue committed entry ``index``; returns what its proposers wait on."""
        pending = Pending(index)
        with self._cond:
            self._queue.append((pending, index, payload))
            self._cond.notify()
        return pending

    def submit_call(self, call: Callable[[], None]) -> None:
        """Run ``call`` on the apply thread after every entry queued so far was applied."""
        with self._cond:
            self._queue.append((None, 0, call))
            self._cond.notify()

    def discard_through(self, index: int) -> int:
        """Tick thread, before a snapshot of ``index`` replaces the image: drop the queued entries it covers."""
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
            while wait and not self._queue and not self._stopping:
                self._cond.wait()
            if not self._queue:
                return None   # nothing queued (and, waiting, stopping)
            batch, self._queue = self._queue, deque()
            self._busy = True
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
            self._after_batch()
