"""A bounded pool of read-only file descriptors for sealed segment files, closed least recently used first.

Only sealed files go through the pool: they are never written, so closing one loses nothing and reopening it is
one open(). The active file of each queue keeps its own descriptor, because closing a file with unflushed writes
would let a later fsync on a fresh descriptor miss a write-back error.
"""

from __future__ import annotations

import os
from collections import OrderedDict

from . import limits
from .errors import InvalidArgument


class HandlePool:
    def __init__(self, handles_max: int = limits.READ_HANDLES_MAX_DEFAULT):
        if type(handles_max) is not int or handles_max < limits.READ_HANDLES_MAX_MIN:
            raise InvalidArgument(f"handles_max must be an integer >= {limits.READ_HANDLES_MAX_MIN}",
                                  handles_max=handles_max)
        self.handles_max = handles_max
        self._fds: OrderedDict[str, int] = OrderedDict()

    def __len__(self) -> int:
        return len(self._fds)

    def fd(self, path: str) -> int:
        fd = self._fds.get(path)
        if fd is not None:
            self._fds.move_to_end(path)
            return fd
        while len(self._fds) >= self.handles_max:
            os.close(self._fds.popitem(last=False)[1])
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        self._fds[path] = fd
        return fd

    def release(self, path: str) -> None:
        fd = self._fds.pop(path, None)
        if fd is not None:
            os.close(fd)

    def close_all(self) -> None:
        while self._fds:
            os.close(self._fds.popitem()[1])
