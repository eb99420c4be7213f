"""producers.log: every batch the producer table records (producers.py), so that a broker that restarts, or loses
power, still answers a resent batch with the offsets it stored it at instead of storing it again.

Kafka keeps this state in the log itself (each record batch names its producer id and sequence, and producer state
snapshots bound the replay at start). Here the batches stay out of the record format (a follower's copy need not
keep the leader's frames one for one) and go to one small append-only file per broker, in storage/lines.py's checked
lines: ``[topic, queue, gen, physical_queue, physical_first, producer, seq, first, count]``.

Durability rides on the data's: a line is written (to the page cache) under the queue's lock, before the send waits
for its records' sync, and the send is answered only once the line is durable too:
- flush "group": the journal is one more file of the group commit (``pending_sync``/``synced``, as a physical
  queue): the round that syncs the file system covers it, so no extra sync;
- flush "fsync": one fdatasync of the journal (``sync``) after the records' own, on a writer thread;
- flush "interval": the flush tick syncs it with the queues (a power loss may take the last interval's batches with
  their records, as it may any acknowledged send under that policy).

Loading keeps a line only if the physical queue it names still holds its records (its recovered end reaches
``physical_first + count``): a line may be durable while its records were not (two files, one syncfs, no order
between them), and a batch whose records were lost must be stored again when it is resent, not answered with offsets
another batch may now hold. The other way round (records durable, line lost: a sync of the records' file that began
before the line was written, a torn tail kept, the kernel's own writeback) is covered by the frames themselves: each
names its producer's batch (storage/record.py ``ProducerMark``), and a start walks the last frames of every queue not
closed cleanly for them (Writer._recovered). A queue's active file is the one walked, so the lines are synced before
an append seals it (Writer._before_roll), and this file is closed before the queues at a stop. A batch handed over
from a holder of an older segment (replication/producer_handover.py) names no physical queue and is kept: its records
are on that segment's holders, sealed.

The file is rewritten from the table's live batches when it holds more than COMPACT_AFTER_LINES lines and twice the
live ones. The rewrite runs on the event loop: it writes and fsyncs the live batches (at most
PRODUCERS_PER_QUEUE_MAX x BATCHES_PER_PRODUCER per queue; 40,000 lines took ~60 ms here) once per
COMPACT_AFTER_LINES recorded batches.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Iterator
import structlog

from runtime import power_loss

from .producers import Batch
from .storage import files, lines
from .storage.errors import CorruptFile, QueueFailed
from .storage.queue import PendingSync

log = structlog.get_logger("broker.producers")

COMPACT_AFTER_LINES = 100_000


Entry = tuple[str, int, Batch]   # (topic, queue, batch), as ProducerTable.entries gives them


class ProducerJournal:
    def __init__(self, path: str):
        self.path = os.path.abspath(path)
        self._lock = threading.Lock()   # the descriptor: a compaction swaps it under a writer thread's fdatasync
        self._lines = 0
        self._written = 0    # bytes written since the broker started (the group commit's "offsets")
        self._synced = 0
        self._failed = False
        self._closed = False
        self._loaded: list[Entry] = []
        self._fd = self._open()

    # Opening.

    def _open(self) -> int:
        loaded = lines.read(self.path)
        for value in loaded.values:
            self._loaded.append(_entry(self.path, value))
        self._lines = len(loaded.values)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | files.O_CLOEXEC, 0o644)
        try:
            if loaded.whole < 0:
                power_loss.created(self.path)
                files.sync_dir(os.path.dirname(self.path))
            elif loaded.whole < os.fstat(fd).st_size:   # a torn last line, never acknowledged: cut it off
                os.ftruncate(fd, loaded.whole)
                files.sync_data(fd)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def load(self, holds: Callable[[str, int], bool]) -> Iterator[Entry]:
        """The batches of the file, oldest first, whose records are still held: ``holds(physical_queue, end)``
        says whether that queue holds its records below ``end``. Once only: the list is dropped."""
        loaded, self._loaded = self._loaded, []
        known: dict[tuple[str, int], bool] = {}
        for e in loaded:
            batch = e[2]
            if not batch.pq:   # handed over from an older segment's holder: its records were never here
                yield e
                continue
            key = (batch.pq, batch.physical + batch.count)
            if key not in known:
                known[key] = holds(*key)
            if known[key]:
                yield e

    # Writing.

    def append(self, topic: str, queue: int, batch: Batch) -> None:
        """Writes one batch's line (page cache; durable with the next sync). Raises QueueFailed once a write or
        sync failed: from then on no batch is recorded, and idempotent sends are refused until a restart."""
        if self._failed or self._closed:
            raise QueueFailed("the producers journal failed or is closed; idempotent sends are refused until the "
                              "broker restarts", path=self.path)
        line = _line(topic, queue, batch)
        try:
            files.write_all(self._fd, line)
        except OSError as e:
            self._failed = True
            raise QueueFailed(f"writing the producers journal failed: {e}", path=self.path) from None
        self._written += len(line)
        self._lines += 1

    def sync(self) -> None:
        """fdatasync (flush "fsync" and "interval"), on a writer thread."""
        with self._lock:
            if self._closed or self._failed or self._synced == self._written:
                return
            written = self._written
            try:
                files.sync_data(self._fd)
            except OSError:
                self._failed = True
                raise
            self._synced = max(self._synced, written)

    def maybe_compact(self, live: Callable[[], Iterable[Entry]]) -> None:
        """Rewrite the file from ``live()`` (the table's batches) once it holds mostly dead lines."""
        if self._failed or self._closed or self._lines <= COMPACT_AFTER_LINES:
            return
        entries = list(live())
        if self._lines <= 2 * len(entries):
            return
        body = b"".join(_line(*e) for e in entries)
        try:
            files.write_atomic(self.path, body)   # written and fsynced before its rename
            # Until the rename is durable, a power loss could bring back the old file without the lines about to be
            # appended to the new one
            files.sync_dir(os.path.dirname(self.path))
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | files.O_CLOEXEC)
        except OSError:
            log.exception("producers_compaction_failed", path=self.path)
            files.remove_if_exists(self.path + files.TMP_SUFFIX)
            self._failed = True   # which file holds what is not known any more: refuse rather than guess
            return
        with self._lock:
            os.close(self._fd)
            self._fd = fd
            self._synced = self._written   # the new file holds every live line, synced
        self._lines = len(entries)

    # The group commit's protocol (group_commit.py), as a physical queue's: its offsets are the bytes written.

    @property
    def max_offset(self) -> int:
        return self._synced

    @property
    def next_offset(self) -> int:
        return self._written

    @property
    def failed(self) -> bool:
        return self._failed

    @property
    def closed(self) -> bool:
        return self._closed

    def pending_sync(self) -> PendingSync | None:
        if self._closed or self._failed or self._synced == self._written:
            return None
        return PendingSync(self._written)

    def synced(self, pending: PendingSync) -> None:
        self._synced = max(self._synced, pending.end_offset)

    def sync_failed(self) -> None:
        self._failed = True

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                if not self._failed and self._synced != self._written:
                    files.sync_data(self._fd)
            finally:
                os.close(self._fd)


def _line(topic: str, queue: int, b: Batch) -> bytes:
    return lines.encode([topic, queue, b.gen, b.pq, b.physical, b.producer, b.seq, b.first, b.count])


def _entry(path: str, value: object) -> Entry:
    try:
        topic, queue, gen, pq, physical, producer, seq, first, count = value  # type: ignore[misc]
        if not (isinstance(topic, str) and isinstance(pq, str)
                and all(type(x) is int for x in (queue, gen, physical, producer, seq, first, count))):
            raise TypeError
    except (ValueError, TypeError):
        raise CorruptFile(f"{path}: a line that passed its check is not [topic, queue, gen, physical_queue, "
                          f"physical_first, producer, seq, first, count]: {str(value)[:200]}", path=path) from None
    return topic, queue, Batch(producer, seq, first, count, gen, pq, physical)
