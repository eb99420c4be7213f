"""Many physical queues under one root directory, by name, sharing one bounded pool of read handles.

Queues open lazily on first use and stay open until deleted or the store closes; each open queue holds one
descriptor for its active file, and sealed files share the pool's `read_handles_max` descriptors.

Thread-safe: the store's lock guards which queues exist and are open (held across an open or create, which are
rare), and each queue guards itself, so the periodic flush and retention ticks may run in a thread of their own.
"""

from __future__ import annotations

import os
import secrets
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Iterator
from typing import Callable, TypeVar

from . import files, limits
from .config import QueueConfig
from .errors import QueueExists, QueueNotFound, StorageError, TooManyQueues, UnsupportedFormat
from .handles import HandlePool
from .names import dir_name, queue_name
from .queue import CREATING_PREFIX, PhysicalQueue
from .scan import Marked

DELETING_PREFIX = ".deleting-"
# The storage format of every queue under a store's root, in a file of its own: 3 is one frame per append with its
# producer mark (record.py). Format 2 (no mark: 32-byte headers) would read as damage, and is refused by name. Format 1
# (a header per record) wrote no such file; read as this format its files would look damaged and recovery would cut
# them, so a root with queues and no FORMAT file is refused by name too.
FORMAT_FILE = ".format"   # a leading dot: no queue's directory is spelled so (names.dir_name escapes it)
FORMAT_NAME = "stator-queues"
FORMAT_VERSION = 3
T = TypeVar("T")
U = TypeVar("U")
# Queues closed at once: each close syncs its active file, its index and its clean marker (four or five syncs), and
# concurrent syncs share the file system's journal commits. One after the other, a broker with 4,000 physical queues
# took 3.6 s to stop when idle, and over the 10 s stop bound under the test suite's load (then killed).
CLOSE_THREADS = 16


class QueueStore:
    def __init__(self, root: str, config: QueueConfig | None = None,
                 read_handles_max: int = limits.READ_HANDLES_MAX_DEFAULT, driven: bool = False):
        """``driven``: ``close`` starts no thread, for a caller that drives the broker in one thread (ops/sim)."""
        self._driven = driven
        self.root = os.path.abspath(root)
        self.config = QueueConfig() if config is None else config
        self._pool = HandlePool(read_handles_max)
        self._open: dict[str, PhysicalQueue] = {}
        self._lock = threading.Lock()
        os.makedirs(self.root, exist_ok=True)
        self._names = self._scan_root()
        self._check_format()

    def _scan_root(self) -> set[str]:
        """Names of the queues on disk, after finishing deletions and dropping creations a crash interrupted."""
        names = set()
        for entry in os.listdir(self.root):
            if entry.startswith((CREATING_PREFIX, DELETING_PREFIX)):
                # An rmtree that fails leaves the leftover to the next open rather than refusing this one (a symlink,
                # which rmtree refuses: tests/test_storage_store_edges.py).
                shutil.rmtree(os.path.join(self.root, entry), ignore_errors=True)
                continue
            name = queue_name(entry)
            if name is not None and os.path.isdir(os.path.join(self.root, entry)):
                names.add(name)
        return names

    def _check_format(self) -> None:
        """Refuses a root whose queues are in another storage format; marks a root without queues as this one's."""
        path = os.path.join(self.root, FORMAT_FILE)
        data = files.read_file(path)
        if data is None:
            if self._names:
                raise UnsupportedFormat(f"{self.root}: {len(self._names)} queues and no {FORMAT_FILE} file: storage "
                                        f"format 1 (a header per record); this build reads format {FORMAT_VERSION}, "
                                        "and Stator keeps no upgrade path before 1.0: start on an empty directory",
                                        path=self.root, version=1, supported=[FORMAT_VERSION])
            files.write_atomic(path, f"{FORMAT_NAME} {FORMAT_VERSION}\n".encode())
            files.sync_dir(self.root)
            return
        # Harmless mutants: ``rpartition`` (a name holds no space, so any second space is refused either way);
        # "ASCII" for "ascii" (one codec).
        name, _, version = data.decode("ascii", "replace").strip().partition(" ")
        if name != FORMAT_NAME or version != str(FORMAT_VERSION):
            raise UnsupportedFormat(f"{path}: storage format {data[:40]!r}; this build reads "
                                    f"'{FORMAT_NAME} {FORMAT_VERSION}', and Stator keeps no upgrade path before 1.0",
                                    path=path, supported=[FORMAT_VERSION])

    def _path(self, name: str) -> str:
        return os.path.join(self.root, dir_name(name))

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._names)

    def __contains__(self, name: str) -> bool:
        return name in self._names

    def __len__(self) -> int:
        return len(self._names)

    def create(self, name: str, start_offset: int = 0) -> PhysicalQueue:
        path = self._path(name)
        with self._lock:
            return self._create(name, path, start_offset)

    def open_or_create(self, name: str, start_offset: int = 0) -> PhysicalQueue:
        """The queue of that name, created if it does not exist yet: one decision under the store's lock.

        A writer that checked for the queue and then created it could lose to a creation still running on another
        thread (a send cancelled mid-creation leaves its thread running) and fail with QueueExists."""
        path = self._path(name)
        with self._lock:
            if name in self._names:
                return self._get(name)
            return self._create(name, path, start_offset)

    def _create(self, name: str, path: str, start_offset: int) -> PhysicalQueue:
        if name in self._names:
            raise QueueExists("queue already exists", name=name)
        if len(self._names) >= limits.QUEUES_MAX:
            raise TooManyQueues(f"a store holds at most {limits.QUEUES_MAX} queues", name=name)
        queue = PhysicalQueue.create(path, start_offset, self.config, self._pool)
        self._names.add(name)
        self._open[name] = queue
        return queue

    def get(self, name: str) -> PhysicalQueue:
        """The open queue of that name, opening (and if need be recovering) it on first use."""
        # One dict lookup is atomic: the hot path skips the lock (harmless mutants: a miss here, which takes the lock).
        queue = self._open.get(name)
        if queue is not None:
            return queue
        with self._lock:
            return self._get(name)

    def _get(self, name: str) -> PhysicalQueue:
        queue = self._open.get(name)
        if queue is not None:
            return queue
        if name not in self._names:
            dir_name(name)  # a malformed name is an invalid argument rather than a missing queue
            raise QueueNotFound("no such queue", name=name)
        queue = PhysicalQueue.open(self._path(name), self.config, self._pool)
        self._open[name] = queue
        return queue

    def recover(self) -> Iterator[tuple[str, list[Marked]]]:
        """Opens now every queue that was not closed cleanly (its last file recovered) and yields, per queue, the
        producer marks of the last frames its recovery walked (record.py ``ProducerMark``). At a start, before
        anything is served: a batch whose records outlived a crash is known by its producer before its resend
        comes. A queue opened already gives what its own recovery found."""
        for name in self.names():
            if name not in self._open and os.path.exists(os.path.join(self._path(name), files.CLEAN_MARKER)):
                continue
            try:
                queue = self.get(name)
            except StorageError:
                continue   # a queue that does not open is refused by whoever asks for it, as before
            marks = queue.take_recovered_marks()
            if marks:
                yield name, marks

    def open_all(self) -> int:
        """Opens every queue on disk (recovering those that did not close cleanly); returns how many."""
        with self._lock:
            for name in sorted(self._names):
                self._get(name)
            return len(self._open)

    def delete(self, name: str) -> None:
        """Removes a queue. It is renamed out of sight first, so a crash mid-way never leaves half a queue."""
        with self._lock:
            if name not in self._names:
                raise QueueNotFound("no such queue", name=name)
            queue = self._open.pop(name, None)
            if queue is not None:
                queue.close()
            doomed = os.path.join(self.root, DELETING_PREFIX + secrets.token_hex(8))
            os.rename(self._path(name), doomed)
            files.sync_dir(self.root)
            self._names.discard(name)
        shutil.rmtree(doomed, ignore_errors=True)   # a failure is not the caller's: the next open retries

    def maybe_flush(self, now_ms: int) -> int:
        """Runs maybe_flush on every open queue (closed and failed ones skip themselves); returns how many synced.
        One queue's failed fsync does not stop the others: the first such error is raised at the end."""
        return sum(self._each_open(lambda q: q.maybe_flush(now_ms)))

    def apply_retention(self, now_ms: int) -> int:
        """Runs retention on every open queue, like maybe_flush; returns how many files were deleted."""
        return sum(self._each_open(lambda q: q.apply_retention(now_ms)))

    def close(self) -> None:
        """Closes every queue (CLOSE_THREADS at a time; driven, one after another on this thread), even when one fails
        to close cleanly; the first such error is raised at the end."""
        with self._lock:
            queues = list(self._open.values())
            self._open.clear()
        try:
            if self._driven:
                self._each(queues, lambda q: q.close())
                return
            # Harmless mutants: the pool's size and its threads' names (every queue is closed whichever thread runs it).
            with ThreadPoolExecutor(max(1, min(CLOSE_THREADS, len(queues))), thread_name_prefix="queue-close") as pool:
                closing = [pool.submit(q.close) for q in queues]
            self._each(closing, lambda done: done.result())   # every close has ended: the first error is raised
        finally:
            self._pool.close_all()

    def _each_open(self, fn: Callable[[PhysicalQueue], T]) -> list[T]:
        # Iterates a copy: the event loop may open or delete queues meanwhile.
        with self._lock:
            queues = list(self._open.values())
        return self._each(queues, fn)

    @staticmethod
    def _each(items: list[U], fn: Callable[[U], T]) -> list[T]:
        """``fn`` of every item, even when one raises; the first error is raised at the end."""
        results, first_error = [], None
        for item in items:
            try:
                results.append(fn(item))
            except Exception as err:
                first_error = first_error or err
        if first_error is not None:
            raise first_error
        return results

    def __enter__(self) -> "QueueStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
