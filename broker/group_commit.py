"""Group commit: one sync of the file system makes the appends of every queue durable at once.

With ``flush = "fsync"`` a send is answered only once its records are on disk. When each append fdatasyncs its own
file (``sync_scope = "file"``), every batch pays a journal commit, a flush of the device's cache and a hand-off to a
thread and back: 0.10-0.17 ms of the broker's CPU per batch of 100 x 1 KB here (``python -m ops.bench.broker_floor
--layers sync,syncfs``). With ``sync_scope = "filesystem"`` (the default) appends only write (storage's flush policy
"group"), and one syncer thread syncs for all of them: a round takes every queue a send has waited on since the last
round, syncs their file system once (syncfs), and wakes every send it covered. Writes that land while a round runs go
into the next, which starts as soon as this one ends, so the busier the broker, the more each sync covers. RocketMQ's
GroupCommitService does this for its one commit log, PostgreSQL's WAL writer for its one log; here the file system's
journal is the one log.

The price: a sync covers everything dirty on that file system, other programs' files too. Give the broker's data_dir
a file system of its own, as Kafka's log.dirs and RocketMQ's store path want, or set ``sync_scope = "file"``.

Readers see a queue only up to its last sync (``PhysicalQueue.max_offset``): a record a crash could take back is never
read, or its offset could later name another record.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable

import structlog

from .storage import PhysicalQueue, QueueFailed, StorageError
from .storage import files

STOP_TIMEOUT_S = 10.0   # a sync in progress finishes first
# A send waits this long for a sync to cover it, then is answered 503. Its records may still become durable and
# readable later, never acknowledged: the client's retry may store them twice, as after any lost answer.
SYNC_WAIT_TIMEOUT_S = 30.0

log = structlog.get_logger("group_commit")


class GroupCommit:
    def __init__(self, root: str, observe_sync_s: Callable[[float], None] | None = None,
                 wait_timeout_s: float = SYNC_WAIT_TIMEOUT_S, driven: bool = False):
        """``root``: a directory on the file system of every queue synced here; ``observe_sync_s``: told the seconds
        of each sync; ``wait_timeout_s``: how long ``durable`` waits. The syncer thread starts with the first wait.
        ``driven``: no thread; each ask schedules ``run_round`` on the event loop instead, for a caller that drives
        the broker on one loop in one thread (ops/sim)."""
        self._driven = driven
        self._round_soon = False   # driven: a run_round is scheduled and has not taken the queues yet
        self._wait_timeout_s = wait_timeout_s
        # One descriptor for the broker's life: syncfs reports a writeback error once per descriptor, so one opened
        # per round would miss an error that happened between rounds.
        self._fd = os.open(root, os.O_RDONLY | files.O_CLOEXEC)
        self._observe = observe_sync_s
        self._wanted = threading.Condition()
        self._asked: set[PhysicalQueue] = set()   # under _wanted: queues waited for since the last round took them
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiting: dict[PhysicalQueue, list[tuple[int, asyncio.Future]]] = {}   # the event loop's only

    async def durable(self, queue: PhysicalQueue, end: int) -> None:
        """Returns once ``queue``'s records below ``end``, written already, are on disk. QueueFailed when the sync
        that should have covered them failed: the queue then refuses writes until reopened. SyncTimedOut after
        ``wait_timeout_s``: a hung disk answers 503, it does not hold the request for ever.

        The timeouts of a queue's waiters fire in the order they began waiting. A seal waits last (it holds the
        queue's lock, so every send in flight registered before it): when its own wait times out, every send whose
        records lie past the readable end it then returns has been refused already."""
        loop = self._loop = asyncio.get_running_loop()   # before the check: a round ending after it wakes this loop
        if queue.max_offset >= end:
            return
        if queue.failed or self._stopping:
            raise _not_synced(queue)
        future = loop.create_future()
        self._waiting.setdefault(queue, []).append((end, future))
        self.ask(queue)
        timer = loop.call_later(self._wait_timeout_s, _time_out, future, queue, self._wait_timeout_s)
        try:
            await future
        except BaseException:
            self._forget(queue, end, future)   # timed out or cancelled: no round will clear it while the disk hangs
            raise
        finally:
            timer.cancel()   # a plain timer, not wait_for: no task per send on the hot path

    def ask(self, queue: PhysicalQueue) -> None:
        """On the event loop: the next round syncs what ``queue`` has written, whether or not anything waits for it
        yet. A follower asks as it writes a leader's records and waits later, for all it wrote meanwhile: asked
        only when it came to wait, a copy's records missed the round that started meanwhile and waited for the one
        after (7.4 ms from a push to its acknowledgement against a leader's 4.9 ms for its own sync, replicas=3)."""
        self._loop = asyncio.get_running_loop()
        if self._stopping:
            return
        # Asked already: the round that takes it reads its written end after taking it, so it covers this write
        # too (set membership is atomic under the GIL). Taking the condition per send cost a tenth of a busy
        # broker's time with the syncer thread contending for it.
        if queue not in self._asked:
            with self._wanted:
                self._asked.add(queue)
                if self._driven:
                    if not self._round_soon:
                        self._round_soon = True
                        self._loop.call_soon(self._driven_round)
                elif self._thread is None:
                    self._thread = threading.Thread(target=self._run, name="group-commit", daemon=True)
                    self._thread.start()
                self._wanted.notify()

    def _forget(self, queue: PhysicalQueue, end: int, future: asyncio.Future) -> None:
        waiters = self._waiting.get(queue)
        if waiters is not None and (end, future) in waiters:
            waiters.remove((end, future))
            if not waiters:
                del self._waiting[queue]

    def _run(self) -> None:
        while True:
            with self._wanted:
                while not self._asked and not self._stopping:
                    self._wanted.wait()
            if not self.run_round():
                return

    def _driven_round(self) -> None:
        self._round_soon = False   # before the round: an ask made after it took the queues schedules the next
        self.run_round()

    def run_round(self) -> bool:
        """One round of the syncer, on the caller's thread: takes the queues asked so far, syncs them and has their
        waiters woken by a callback on the event loop. False once it should stop: stopping (nothing taken), or the
        loop is closed (nobody waits any more)."""
        with self._wanted:
            if self._stopping:
                return False
            queues, self._asked = self._asked, set()
        try:
            self._sync(queues)
        except Exception:  # noqa: BLE001 - the thread must live on, or every later send would wait for ever
            log.exception("sync_round_failed", queues=len(queues))
            for queue in queues:
                queue.sync_failed()
        loop = self._loop
        if loop is not None:
            try:
                loop.call_soon_threadsafe(self._wake)
            except RuntimeError:
                return False
        return True

    def _sync(self, queues: set[PhysicalQueue]) -> None:
        """One round: take what each queue has written, sync once, mark it readable."""
        pending = [(queue, p) for queue in queues if (p := queue.pending_sync()) is not None]
        if not pending:
            return
        started = time.perf_counter()
        try:
            files.sync_filesystem(self._fd)
        except OSError as err:
            log.error("sync_failed", queues=len(pending), error=str(err))
            for queue, _ in pending:
                queue.sync_failed()
            return
        if self._observe is not None:
            self._observe(time.perf_counter() - started)
        for queue, p in pending:
            queue.synced(p)

    def _wake(self, failing: bool = False) -> None:
        """On the event loop after each round: done for each waiter its queue's readable end reached; failed for
        the rest of a failed or closed queue (or all the rest, ``failing``). Others wait for the next round, which
        they asked for."""
        for queue in list(self._waiting):
            reached, give_up = queue.max_offset, failing or queue.failed or queue.closed
            keep = []
            for end, future in self._waiting[queue]:
                if future.done():
                    continue   # its send was cancelled
                if end <= reached:
                    future.set_result(None)
                elif give_up:
                    future.set_exception(_not_synced(queue))
                else:
                    keep.append((end, future))
            if keep:
                self._waiting[queue] = keep
            else:
                del self._waiting[queue]

    def close(self) -> None:
        """On the event loop, before the store closes: stops the syncer (a round in progress finishes first), tells
        whoever still waits whether a sync reached them, and closes the descriptor."""
        with self._wanted:
            self._stopping = True
            self._wanted.notify()
        if self._thread is not None:
            self._thread.join(STOP_TIMEOUT_S)
        self._wake(failing=True)
        if self._thread is None or not self._thread.is_alive():
            os.close(self._fd)   # else a syncfs still holds it: leave it to the process's end


class SyncTimedOut(StorageError):
    code = "SYNC_TIMED_OUT"


def _time_out(future: asyncio.Future, queue: PhysicalQueue, seconds: float) -> None:
    if not future.done():
        future.set_exception(SyncTimedOut(f"no sync covered this append within {seconds} s", path=queue.path))


def _not_synced(queue: PhysicalQueue) -> QueueFailed:
    return QueueFailed("the sync that should have covered this append failed or the broker is stopping; the queue "
                       "refuses writes until reopened", path=queue.path)
