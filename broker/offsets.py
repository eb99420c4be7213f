"""Consumer offsets kept beside the data: one small append-only file per broker, replayed into a dict on start.

Each offset is kept with the gen of the queue's head segment it was committed on: a logic queue's offset belongs to
the queue across all its segments, and when a queue moves away and back, the broker's own older value must lose to
a newer one committed on another broker meanwhile (broker/reads.py ``read_offset``: the highest gen wins).

Each offset is stamped ``(gen, seq)``: ``seq`` grows with every commit its leader stamps (``stamp``: a counter
started from the wall clock in microseconds, so a broker restarted within a gen still counts up). A queue's copies hold
the commits its leader pushes to them (broker/replication/offsets.py), which can arrive out of order, twice, or after
a snapshot that already held them: a key keeps the value with the highest ``(gen, seq)`` (``newer``), here and on
replay, whatever order they came in.

Each commit is one checked JSON line ``[group, topic, queue, offset, gen, seq]`` (storage/lines.py: a CRC-32 and a
format version), acknowledged only once an fsync covering it has returned. One syncer thread owns the file: each
round it takes every commit queued since the last one, writes their lines in one write and covers them with one
fsync (group commit), so the event loop never waits for the disk and concurrent commits share an fsync.
The file is rewritten compactly when it grows past a bound, so its size stays proportional to the number of
(group, topic, queue) keys. Its directory is fsynced after the file is created and after each compaction's rename:
until then a power loss could take the file's name, and every commit in it, with it.

Refusals, as coded ApiErrors the HTTP layer answers directly:
- 409 TOO_MANY_OFFSETS: the commit would add a key beyond KEYS_MAX, the broker's capacity, like TOO_MANY_TOPICS;
  commits to keys it already holds still succeed.
- 503 TOO_MANY_WAITERS: COMMITS_WAITING_MAX commits already wait for their fsync; retry after a short back-off.
- 503 STORAGE_UNAVAILABLE: a write or fsync of the file failed (the kernel may have dropped the written pages, so
  nothing after can be trusted until a restart replays the file), the store is closed, or no fsync confirmed the
  commit within COMMIT_WAIT_S. The commit may or may not have been stored.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import threading
import time
from typing import Callable, NamedTuple

import structlog

from wire.errors import ApiError, rejection

from .storage import files, lines
from .storage.errors import CorruptFile

log = structlog.get_logger("broker.offsets")

COMPACT_AFTER_LINES = 100_000
KEYS_MAX = 1_000_000
COMMITS_WAITING_MAX = 10_000  # queued or being synced; each holds a request open
COMMIT_WAIT_S = 30.0          # a disk that stops answering fails the commit instead of hanging the request
CLOSE_TIMEOUT_S = 10.0        # how long close() waits for queued commits to be synced
IDLE_WAKE_S = 1.0             # the syncer's idle wait is bounded; waking with nothing queued just waits again

Key = tuple[str, str, int]
Refusal = Callable[[], ApiError]


class Committed(NamedTuple):
    offset: int
    gen: int      # of the head segment it was committed on
    seq: int      # its leader's stamp: orders the commits of one gen


def newer(a: Committed, b: Committed | None) -> bool:
    """Whether ``a`` supersedes ``b`` (None: nothing held)."""
    return b is None or (a.gen, a.seq) > (b.gen, b.seq)


class _Commit(NamedTuple):
    key: Key
    value: Committed
    future: asyncio.Future


def _too_many_offsets() -> ApiError:
    return rejection(409, "TOO_MANY_OFFSETS", f"this broker keeps at most {KEYS_MAX} committed offsets",
                     keys_max=KEYS_MAX)


def _unavailable() -> ApiError:
    return rejection(503, "STORAGE_UNAVAILABLE", "the broker could not store the offset: its offsets file failed "
                     "or is closed, or the disk did not confirm in time")


class OffsetStore:
    def __init__(self, path: str, driven: bool = False):
        """``driven``: no syncer thread; a commit schedules ``run_pending`` on its event loop instead, for a caller
        that drives the broker on one loop in one thread (ops/sim)."""
        self.path = os.path.abspath(path)
        self._offsets: dict[Key, Committed] = {}  # durable commits only; written by the syncer alone (run_pending)
        self._by_queue: dict[tuple[str, int], set[str]] = {}   # (topic, queue) -> groups: a queue's snapshot
        self._seq = itertools.count(time.time_ns() // 1000)
        self._lines = 0
        self._fd = self._open_file()
        self._cond = threading.Condition()
        self._queue: list[_Commit] = []
        self._waiting = 0
        self._closing = False
        self._failed = False
        self._driven = driven
        self._pending_soon = False   # driven: a run_pending is scheduled and has not taken the queue yet
        self._thread: threading.Thread | None = None
        if not driven:
            self._thread = threading.Thread(target=self._run, name="offsets-sync", daemon=True)
            self._thread.start()

    # Opening.

    def _open_file(self) -> int:
        kept = self._replay()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | files.O_CLOEXEC, 0o644)
        try:
            if kept is None:
                files.sync_dir(os.path.dirname(self.path))
            elif kept < os.fstat(fd).st_size:
                os.ftruncate(fd, kept)
                files.sync_data(fd)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _replay(self) -> int | None:
        """Loads the file and returns the length of its good lines (None when there is no file). What follows them
        is the torn remains of a write a crash cut short, never acknowledged; the caller cuts it off, or the next
        commit's line would be glued to it and lost with it on the following replay. Damage (not a tear)
        raises CorruptFile (lines.py)."""
        loaded = lines.read(self.path)
        for value in loaded.values:
            self._replay_value(value)
        return None if loaded.whole < 0 else loaded.whole

    def _replay_value(self, value: object) -> None:
        try:
            g, t, q, o, gen, seq = value  # type: ignore[misc]
        except (ValueError, TypeError):
            raise CorruptFile(f"{self.path}: a line that passed its check is not [group, topic, queue, offset, gen, "
                              f"seq] (an offsets file of a build before replicated offsets, 0.2, is refused too): "
                              f"{str(value)[:200]}", path=self.path) from None
        self._keep((g, t, q), Committed(o, gen, seq))
        self._lines += 1

    def _keep(self, key: Key, value: Committed) -> None:
        if newer(value, self._offsets.get(key)):
            self._offsets[key] = value
            self._by_queue.setdefault(key[1:], set()).add(key[0])

    # Committing.

    def get(self, group: str, topic: str, queue: int) -> int | None:
        committed = self._offsets.get((group, topic, queue))
        return None if committed is None else committed.offset

    def get_committed(self, group: str, topic: str, queue: int) -> Committed | None:
        return self._offsets.get((group, topic, queue))

    def queue_values(self, topic: str, queue: int) -> list[tuple[Key, Committed]]:
        """Every durable commit of one queue, any group (what a copy joining the in-sync set is sent)."""
        groups = list(self._by_queue.get((topic, queue), ()))
        found = ((g, self._offsets.get((g, topic, queue))) for g in groups)
        return [((g, topic, queue), v) for g, v in found if v is not None]

    def stamp(self, offset: int, gen: int) -> Committed:
        """A new commit of this broker, as the leader of a head of ``gen``: the next seq."""
        return Committed(offset, gen, next(self._seq))

    def snapshot(self) -> dict[Key, int]:
        """Every durable commit's offset, as of now (a copy: the syncer thread goes on writing the store's own map)."""
        return {k: v.offset for k, v in list(self._offsets.items())}

    async def commit(self, group: str, topic: str, queue: int, offset: int, *, gen: int) -> None:
        """A commit of this broker's own (``stamp``): see ``store``."""
        await self.store([((group, topic, queue), self.stamp(offset, gen))])

    async def store(self, values: list[tuple[Key, Committed]]) -> None:
        """Returns once an fsync covering every value's line has returned (a value older than the one held is
        answered at once: the newer one stands); raises the ApiErrors listed above."""
        loop = asyncio.get_running_loop()
        futures = []
        with self._cond:
            if self._closing or self._failed:
                raise _unavailable()
            if self._waiting + len(values) > COMMITS_WAITING_MAX:
                raise rejection(503, "TOO_MANY_WAITERS", "too many offset commits wait for the disk; retry shortly",
                                limit=COMMITS_WAITING_MAX)
            for key, value in values:
                futures.append(loop.create_future())
                self._queue.append(_Commit(key, value, futures[-1]))
            self._waiting += len(values)
            self._cond.notify()
            if self._driven and not self._pending_soon:
                self._pending_soon = True
                loop.call_soon(self._driven_pending)
        try:
            await asyncio.wait_for(asyncio.gather(*futures), COMMIT_WAIT_S)
        except asyncio.TimeoutError:
            raise _unavailable() from None

    # The syncer thread.

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._cond.wait(IDLE_WAKE_S)
            if not self.run_pending():
                return  # closing, and every queued commit has been answered

    def _driven_pending(self) -> None:
        self._pending_soon = False   # before the batch: a commit queued after it took the queue schedules the next
        self.run_pending()

    def run_pending(self) -> bool:
        """One batch of the syncer, on the caller's thread: stores every commit queued so far under one fsync, has
        their waiters answered by a callback on their event loop, and compacts the file if it is due. False when
        nothing was queued."""
        with self._cond:
            batch, self._queue = self._queue, []
        if not batch:
            return False
        refusals = self._store(batch)
        with self._cond:
            self._waiting -= len(batch)
        _answer(batch, refusals)
        self._maybe_compact()
        return True

    def _store(self, batch: list[_Commit]) -> list[Refusal | None]:
        """Writes the batch's admitted lines and fsyncs them once; returns each commit's refusal, or None."""
        if self._failed:
            return [_unavailable] * len(batch)
        refusals: list[Refusal | None] = []
        out: list[bytes] = []
        new_keys: set[Key] = set()
        kept: dict[Key, Committed] = {}   # the newest value of each key in this batch
        for c in batch:
            if not newer(c.value, kept.get(c.key) or self._offsets.get(c.key)):
                refusals.append(None)     # superseded: answered as stored, nothing to write
                continue
            if c.key not in self._offsets and c.key not in new_keys:
                if len(self._offsets) + len(new_keys) >= KEYS_MAX:
                    refusals.append(_too_many_offsets)
                    continue
                new_keys.add(c.key)
            kept[c.key] = c.value
            out.append(lines.encode([*c.key, *c.value]))
            refusals.append(None)
        if not out:
            return refusals
        try:
            files.write_all(self._fd, b"".join(out))
            files.sync_data(self._fd)
        except OSError:
            log.exception("offsets_write_failed", path=self.path)
            self._failed = True
            return [r or _unavailable for r in refusals]
        for key, value in kept.items():
            self._keep(key, value)
        self._lines += len(out)
        return refusals

    def _maybe_compact(self) -> None:
        if self._failed or not (self._lines > COMPACT_AFTER_LINES and self._lines > 2 * len(self._offsets)):
            return
        tmp = self.path + files.TMP_SUFFIX
        body = b"".join(lines.encode([g, t, q, *v]) for (g, t, q), v in self._offsets.items())
        try:
            files.write_atomic(self.path, body)
        except OSError:
            log.exception("offsets_compaction_failed", path=self.path)  # the old file still holds every commit
            files.remove_if_exists(tmp)
            return
        try:
            # Until the rename is durable, a power loss could bring back the old file without the lines that are
            # about to be appended to the new one.
            files.sync_dir(os.path.dirname(self.path))
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | files.O_CLOEXEC)
        except OSError:
            log.exception("offsets_compaction_failed", path=self.path)
            self._failed = True
            return
        os.close(self._fd)
        self._fd = fd
        self._lines = len(self._offsets)

    # Closing.

    def close(self) -> None:
        """Refuses new commits and waits up to CLOSE_TIMEOUT_S for the queued ones to be synced and answered."""
        with self._cond:
            if self._closing:
                return
            self._closing = True
            self._cond.notify()
        if self._thread is None:
            while self.run_pending():   # driven: what is queued is stored here, as the thread would before ending
                pass
            os.close(self._fd)
            return
        self._thread.join(CLOSE_TIMEOUT_S)
        if self._thread.is_alive():
            # Stuck in a write or fsync: closing the descriptor under it could let a reused number take its writes.
            log.warning("offsets_close_timed_out", path=self.path, timeout_s=CLOSE_TIMEOUT_S)
            return
        os.close(self._fd)


def _answer(batch: list[_Commit], refusals: list[Refusal | None]) -> None:
    """Hands each waiter its outcome on its own event loop, one callback per loop and round."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future, Refusal | None]]] = {}
    for c, refusal in zip(batch, refusals):
        by_loop.setdefault(c.future.get_loop(), []).append((c.future, refusal))
    for loop, outcomes in by_loop.items():
        try:
            loop.call_soon_threadsafe(_settle, outcomes)
        except RuntimeError:
            pass  # that loop has closed: nobody waits for these answers any more


def _settle(outcomes: list[tuple[asyncio.Future, Refusal | None]]) -> None:
    for future, refusal in outcomes:
        if future.done():
            continue  # its waiter timed out or went away; the commit stands
        if refusal is None:
            future.set_result(None)
        else:
            future.set_exception(refusal())
