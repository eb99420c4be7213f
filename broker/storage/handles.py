"""A bounded pool of read-only file descriptors for sealed segment files, closed least recently used first.

Only sealed files go through the pool: they are never written, so closing one loses nothing and reopening it is
one open(). The active file of each queue keeps its own descriptor, because closing a file with unflushed writes
would let a later fsync on a fresh descriptor miss a write-back error.

Queues sharing a pool run in different threads under their own locks, so a descriptor is leased for the length of
a read: eviction skips leased descriptors, or another queue could close one mid-read and the kernel could hand its
number to an unrelated file, turning the pread into a silent read of the wrong data. While every descriptor is
leased the pool runs over its bound by at most the number of reading threads.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from contextlib import contextmanager
from typing import Iterator

from . import limits
from .errors import InvalidArgument


class HandlePool:
    def __init__(self, handles_max: int = limits.READ_HANDLES_MAX_DEFAULT):
        if type(handles_max) is not int or handles_max < limits.READ_HANDLES_MAX_MIN:
            raise InvalidArgument(f"handles_max must be an integer >= {limits.READ_HANDLES_MAX_MIN}",
                                  handles_max=handles_max)
        self.handles_max = handles_max
        self._fds: OrderedDict[str, int] = OrderedDict()
        self._leases: dict[str, int] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._fds)

    @contextmanager
    def lease(self, path: str) -> Iterator[int]:
        """A descriptor for `path` that stays open until the block ends. The caller holds the lock of the queue
        owning `path`, which is what keeps release() of the same path from running meanwhile."""
        with self._lock:
            fd = self._fds.get(path)
            if fd is None:
                self._evict_for_one()
                fd = self._fds[path] = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            else:
                self._fds.move_to_end(path)
            self._leases[path] = self._leases.get(path, 0) + 1
        try:
            yield fd
        finally:
            with self._lock:
                left = self._leases.pop(path) - 1
                if left:
                    self._leases[path] = left

    def _evict_for_one(self) -> None:
        excess = len(self._fds) + 1 - self.handles_max
        if excess <= 0:
            return
        idle = []
        for path in self._fds:  # least recently used first
            if path not in self._leases:
                idle.append(path)
                if len(idle) == excess:
                    break
        for path in idle:
            os.close(self._fds.pop(path))

    def release(self, path: str) -> None:
        with self._lock:
            fd = self._fds.pop(path, None)
        if fd is not None:
            os.close(fd)

    def close_all(self) -> None:
        with self._lock:
            fds, self._fds = list(self._fds.values()), OrderedDict()
        for fd in fds:
            os.close(fd)
