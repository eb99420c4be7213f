"""Many physical queues under one root directory, by name, sharing one bounded pool of read handles.

Queues open lazily on first use and stay open until deleted or the store closes; each open queue holds one
descriptor for its active file, and sealed files share the pool's `read_handles_max` descriptors.
"""

from __future__ import annotations

import os
import secrets
import shutil

from . import files, limits
from .config import QueueConfig
from .errors import QueueExists, QueueNotFound, TooManyQueues
from .handles import HandlePool
from .names import dir_name, queue_name
from .queue import CREATING_PREFIX, PhysicalQueue

DELETING_PREFIX = ".deleting-"


class QueueStore:
    def __init__(self, root: str, config: QueueConfig | None = None,
                 read_handles_max: int = limits.READ_HANDLES_MAX_DEFAULT):
        self.root = os.path.abspath(root)
        self.config = QueueConfig() if config is None else config
        self._pool = HandlePool(read_handles_max)
        self._open: dict[str, PhysicalQueue] = {}
        os.makedirs(self.root, exist_ok=True)
        self._names = self._scan_root()

    def _scan_root(self) -> set[str]:
        """Names of the queues on disk, after finishing deletions and dropping creations a crash interrupted."""
        names = set()
        for entry in os.listdir(self.root):
            if entry.startswith((CREATING_PREFIX, DELETING_PREFIX)):
                shutil.rmtree(os.path.join(self.root, entry), ignore_errors=True)
                continue
            name = queue_name(entry)
            if name is not None and os.path.isdir(os.path.join(self.root, entry)):
                names.add(name)
        return names

    def _path(self, name: str) -> str:
        return os.path.join(self.root, dir_name(name))

    def names(self) -> list[str]:
        return sorted(self._names)

    def __contains__(self, name: str) -> bool:
        return name in self._names

    def __len__(self) -> int:
        return len(self._names)

    def create(self, name: str, start_offset: int = 0) -> PhysicalQueue:
        path = self._path(name)
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
        queue = self._open.get(name)
        if queue is not None:
            return queue
        if name not in self._names:
            dir_name(name)  # a malformed name is an invalid argument rather than a missing queue
            raise QueueNotFound("no such queue", name=name)
        queue = PhysicalQueue.open(self._path(name), self.config, self._pool)
        self._open[name] = queue
        return queue

    def open_all(self) -> int:
        """Opens every queue on disk (recovering those that did not close cleanly); returns how many."""
        for name in self.names():
            self.get(name)
        return len(self._open)

    def delete(self, name: str) -> None:
        """Removes a queue. It is renamed out of sight first, so a crash mid-way never leaves half a queue."""
        if name not in self._names:
            raise QueueNotFound("no such queue", name=name)
        queue = self._open.pop(name, None)
        if queue is not None:
            queue.close()
        doomed = os.path.join(self.root, DELETING_PREFIX + secrets.token_hex(8))
        os.rename(self._path(name), doomed)
        files.sync_dir(self.root)
        self._names.discard(name)
        shutil.rmtree(doomed, ignore_errors=True)

    def maybe_flush(self, now_ms: int) -> int:
        """Runs maybe_flush on every open, healthy queue; returns how many synced."""
        return sum(q.maybe_flush(now_ms) for q in self._open.values() if not q.failed)

    def apply_retention(self, now_ms: int) -> int:
        """Runs retention on every open, healthy queue; returns how many files were deleted."""
        return sum(q.apply_retention(now_ms) for q in self._open.values() if not q.failed)

    def close(self) -> None:
        """Closes every queue, even when one fails to close cleanly; the first such error is raised at the end."""
        first_error: BaseException | None = None
        for queue in self._open.values():
            try:
                queue.close()
            except Exception as err:
                first_error = first_error or err
        self._open.clear()
        self._pool.close_all()
        if first_error is not None:
            raise first_error

    def __enter__(self) -> "QueueStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
