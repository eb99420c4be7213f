"""Every os.pread a test makes, by file: what a storage read costs the disk (tests/test_storage_read_chunks.py,
tests/test_storage_index_file.py)."""

from __future__ import annotations

import os
from typing import NamedTuple


class Pread(NamedTuple):
    file: str   # the file's name, without its directory
    size: int   # bytes asked
    pos: int


class Preads:
    """Installed with pytest's monkeypatch: each os.pread is recorded, then made."""

    def __init__(self, monkeypatch):
        self.calls: list[Pread] = []
        real = os.pread

        def counted(fd: int, n: int, pos: int) -> bytes:
            self.calls.append(Pread(os.path.basename(os.readlink(f"/proc/self/fd/{fd}")), n, pos))
            return real(fd, n, pos)
        monkeypatch.setattr(os, "pread", counted)

    def during(self, read):
        """``read()``'s answer, with ``calls`` holding its preads alone."""
        self.calls.clear()
        return read()

    @property
    def asked(self) -> int:
        return sum(c.size for c in self.calls)

    def positions(self, file: str) -> list[int]:
        return [c.pos for c in self.calls if c.file == file]
