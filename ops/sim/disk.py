"""A simulated disk under Stator's journal (meta/raft/journal.py's JournalIO) and the node's disk identity.

What a crash keeps (``SimDisk.crash``):
- "process" (kill -9): everything written, synced or not (the page cache survives the process).
- "power" mid-step (``undo_step`` first): the syncs of the step under way never completed.
- "power": each file keeps what its last sync covered plus a prefix of the unsynced tail cut at a 512-byte sector
  (none, some or all of it); a truncation never synced is kept or undone, at random; a create never made durable by
  a directory sync is lost with probability 1/2, a remove never made durable is undone with probability 1/2. That
  is stronger than ext4 in data=ordered mode, and the journal claims to survive all of it (meta/raft/journal.py's
  docstring). Never random garbage: a torn record of garbage would be a JournalDamaged false alarm.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from meta.raft.journal import JournalIO

SECTOR_BYTES = 512
DISK_ID_HEX_CHARS = 32


@dataclass
class SimFile:
    data: bytearray = field(default_factory=bytearray)   # what a read sees (page cache)
    durable: bytes = b""                                  # what a power loss keeps for sure


class SimDisk:
    """One node's disk: files by path, which of their names are durable, and the disk's identity."""

    def __init__(self, rng: random.Random):
        self._rng = rng
        self.files: dict[str, SimFile] = {}
        self.durable_names: set[str] = set()
        self.removed: dict[str, SimFile] = {}       # removed, the removal not yet durable
        self.dirs: set[str] = set()
        self.disk_id: str | None = None
        self.syncs = 0
        self.power_losses = 0
        self.bytes_lost = 0          # unsynced bytes power losses took (for the summary: the faults did bite)
        self._undo: list[tuple[str, Any]] = []   # how to take back the syncs of the step under way

    def begin_step(self) -> None:
        """A node step starts: the syncs it makes complete only when it ends (a crash mid-step undoes them)."""
        self._undo = []

    def note(self, kind: str, what: Any) -> None:
        self._undo.append((kind, what))

    def undo_step(self) -> None:
        """Power lost mid-step: none of the step's syncs completed (its appends stay in the page cache, to be cut)."""
        for kind, what in reversed(self._undo):
            if kind == "sync":
                f, durable = what
                f.durable = durable
            elif kind == "names":
                self.durable_names, self.removed = what
            elif kind == "replace":
                path, old, was_durable = what
                if old is None:
                    self.files.pop(path, None)
                else:
                    self.files[path] = old
                if not was_durable:
                    self.durable_names.discard(path)
        self._undo = []

    def identity(self, data_dir: str) -> tuple[str, bool]:
        """Stands in for disk_identity.load_or_create: written durably once, on first use."""
        if self.disk_id is not None:
            return self.disk_id, False
        self.disk_id = "%032x" % self._rng.getrandbits(DISK_ID_HEX_CHARS * 4)
        return self.disk_id, True

    def sync_directory(self, path: str) -> None:
        self.note("names", (set(self.durable_names), dict(self.removed)))
        prefix = path.rstrip("/") + "/"
        for name in [p for p in self.files if os.path.dirname(p) + "/" == prefix]:
            self.durable_names.add(name)
        for name in [p for p in self.removed if os.path.dirname(p) + "/" == prefix]:
            del self.removed[name]
            self.durable_names.discard(name)

    def crash(self, kind: str) -> None:
        if kind == "process":
            return
        self.power_losses += 1
        rng = self._rng
        kept: dict[str, SimFile] = {}
        for path in sorted(self.files):
            f = self.files[path]
            if path not in self.durable_names and rng.random() < 0.5:
                self.durable_names.discard(path)
                continue
            kept[path] = self._cut(f)
        for path in sorted(self.removed):
            if path in kept:
                continue
            if rng.random() < 0.5:
                kept[path] = SimFile(bytearray(self.removed[path].durable), self.removed[path].durable)
        self.files = kept
        self.removed = {}
        self.durable_names = set(kept)

    def _cut(self, f: SimFile) -> SimFile:
        rng, data, durable = self._rng, bytes(f.data), f.durable
        if not data.startswith(durable):         # truncated (and maybe appended) since the last sync
            if rng.random() < 0.5:
                return SimFile(bytearray(durable), durable)
            common = 0
            while common < min(len(data), len(durable)) and data[common] == durable[common]:
                common += 1
            base = common
        else:
            base = len(durable)
        cuts = [base] + list(range((base // SECTOR_BYTES + 1) * SECTOR_BYTES, len(data), SECTOR_BYTES)) + [len(data)]
        end = rng.choice(cuts)
        kept = data[:end]
        self.bytes_lost += len(data) - end
        return SimFile(bytearray(kept), kept)


class SimJournalIO(JournalIO):
    """JournalIO over a SimDisk; one per node incarnation (its handles die with it)."""

    def __init__(self, disk: SimDisk):
        self.disk = disk
        self._handles: dict[int, str] = {}
        self._next = 3

    def make_directory(self, path: str) -> None:
        self.disk.dirs.add(path.rstrip("/"))

    def list_directory(self, path: str) -> list[str]:
        prefix = path.rstrip("/") + "/"
        return sorted(p[len(prefix):] for p in self.disk.files if p.startswith(prefix) and "/" not in p[len(prefix):])

    def read(self, path: str) -> bytes | None:
        f = self.disk.files.get(path)
        return None if f is None else bytes(f.data)

    def write_durably(self, path: str, chunks: Iterable[bytes], tmp_path: str) -> None:
        data = b"".join(chunks)
        self.disk.note("replace", (path, self.disk.files.get(path), path in self.disk.durable_names))
        self.disk.files[path] = SimFile(bytearray(data), data)
        self.disk.durable_names.add(path)
        self.disk.removed.pop(path, None)

    def remove(self, path: str) -> bool:
        f = self.disk.files.pop(path, None)
        if f is None:
            return False
        if path in self.disk.durable_names:
            self.disk.removed[path] = f
        return True

    def create(self, path: str) -> int:
        if path in self.disk.files:
            raise FileExistsError(path)
        self.disk.files[path] = SimFile()
        return self._open(path)

    def open_append(self, path: str) -> int:
        if path not in self.disk.files:
            raise FileNotFoundError(path)
        return self._open(path)

    def _open(self, path: str) -> int:
        handle, self._next = self._next, self._next + 1
        self._handles[handle] = path
        return handle

    def _file(self, handle: int) -> SimFile:
        return self.disk.files[self._handles[handle]]

    def append(self, handle: int, data: bytes) -> None:
        self._file(handle).data += data

    def truncate(self, handle: int, size: int) -> None:
        del self._file(handle).data[size:]

    def sync(self, handle: int) -> None:
        f = self._file(handle)
        self.disk.note("sync", (f, f.durable))
        f.durable = bytes(f.data)
        self.disk.syncs += 1

    def sync_directory(self, path: str) -> None:
        self.disk.sync_directory(path)

    def close(self, handle: int) -> None:
        self._handles.pop(handle, None)
