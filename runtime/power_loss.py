"""Power loss for tests: a sync ledger, so that a kill -9 followed by ``lose_unsynced`` loses exactly what a power
loss would have lost. Never on in production: only a node started with FLAG (``stator meta serve`` and ``stator broker
serve``) turns it on. There is no config key for it on purpose: a config file is copied from host to host, a command
line is typed for one test (the config schemas refuse unknown keys, so a key in a config is refused by name).

Why a ledger: a kill -9 keeps the page cache, so every write the process made survives it, synced or not. With the
mode on, the sync calls themselves feed the ledger, never the code's own account of what it synced: ``sync_fd`` (an
fsync or fdatasync of one file: every durable file of meta and the broker goes through it) records "P is durable up
to L bytes" after the call returns, L being the file's size *before* it started (a sync covers what was written
before it, nothing after); ``sync_filesystem`` (the broker's group commit, one syncfs for every queue) notes the size
of every file under the node's data directory before the call and records each one that grew once it returns. So a
sync left out, done on the wrong file or before the write it should cover, or a record marked readable before its
sync returned, loses data at the next power loss, as on a real disk. After the process is gone, ``lose_unsynced``
cuts every file the ledger knows back to its durable length, as the disk would hold it after a power loss.

The writes still go to the files at once, so the process reads its own unsynced writes back from the page cache, as
it does in production. That is more faithful than holding them in the process's memory
(meta/raft/journal.py MemoryUntilSyncJournalIO does that for the journal alone): no second code path for reads, and
what the disk holds before the cut is byte for byte what the node wrote.

The ledger is an append-only file in the node's data directory written with plain os.write and never synced: a
kill -9 keeps it whole as the process left it (only a real power loss would lose it, and this mode is for tests run
on a machine that keeps its power). A kill between a sync and its record loses a write nobody was told about.

Records, one line each (``<kind> <number> <path>``; path absolute, last on the line so it may hold spaces):
- ``D <length> <path>``: synced up to length, by a sync of the file itself (a file replaced whole by a rename,
  ``write_atomic``, is WHOLE: never cut);
- ``S <length> <path>``: its file system was synced while it held length bytes: durable up to at least that (a
  syncfs runs beside the fsyncs of single files, so it never moves a durable length back);
- ``N 0 <path>``: created; until a ``C`` of its directory, a power loss may lose the file itself;
- ``C 0 <dir>``: the directory was synced: files created in it so far are there to stay;
- ``R 0 <path>``: removed (the path and everything under it are forgotten);
- ``A <size> <path>``: space allocated ahead to size (meta's raft journal, meta/raft/journal.py OsJournalIO): the
  file's size says nothing of its data, which ends where the bytes past it read as zeros; a power loss keeps the
  size and zeros what it loses (``A 0``: nothing allocated ahead any more, the file was cut to its data). Its ``D``
  records carry the data's length the writer gives (``sync_fd``'s ``written``): the one place the ledger takes a
  writer's word, since a file's size cannot tell it.

What the model leaves out, on purpose: an unsynced rename or unlink is taken as durable (the old content is gone, so
a power loss that undoes a rename cannot be played); an unsynced truncation is never undone; a file is never made
longer than it is; a file truncated while a syncfs that saw it longer was under way keeps the longer durable length.
Each of these makes the mode lose less than a real power loss might, never more. Writers must not sync one file
from two threads at once with ``sync_fd`` (the broker holds the queue's lock through its fsync, offsets and the pop
journal have one syncer thread, meta's journal syncs on its tick thread): the last ``D`` wins.
"""

from __future__ import annotations

import os
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass

FLAG = "--unsafe-power-loss-ledger"
LEDGER_NAME = "power-loss-ledger"
# The ledger is rewritten from its in-memory state once it grows past this (a long run syncs thousands of times).
LEDGER_COMPACT_BYTES = 4 * 1024 * 1024
# A torn write keeps between 1 byte and this much of the lost tail (sector and page sizes are 512 B to 4 KiB).
TEAR_BYTES_MAX = 8 * 1024

DURABLE, SYNCED_AT_LEAST, CREATED, DIR_SYNCED, REMOVED, ALLOCATED = "D", "S", "N", "C", "R", "A"
KINDS = (DURABLE, SYNCED_AT_LEAST, CREATED, DIR_SYNCED, REMOVED, ALLOCATED)
ZEROS_CHUNK_BYTES = 1 << 20   # a file allocated ahead is read (for where its data ends) and zeroed this much at a time
WHOLE = 2**62   # the durable length of a file replaced whole by a rename: longer than any file, so never cut


@dataclass
class _File:
    durable: int = 0
    created: bool = False      # made since its directory was last synced
    allocated: int = 0         # the size space was allocated ahead to (0: none; the size is where the data ends)


class _State:
    """Every file the ledger knows, as its records so far say."""

    def __init__(self) -> None:
        self.files: dict[str, _File] = {}

    def apply(self, kind: str, number: int, path: str) -> None:
        if kind == DURABLE:
            self.files.setdefault(path, _File()).durable = number
        elif kind == SYNCED_AT_LEAST:
            f = self.files.setdefault(path, _File())
            f.durable = max(f.durable, number)
        elif kind == CREATED:
            self.files[path] = _File(0, True)
        elif kind == ALLOCATED:
            # A file the ledger never heard of counts as durable whole: allocating ahead in it says nothing new
            if path in self.files:
                self.files[path].allocated = number
        elif kind == DIR_SYNCED:
            for name, f in self.files.items():
                if f.created and os.path.dirname(name) == path:
                    f.created = False
        elif kind == REMOVED:
            under = path.rstrip("/") + "/"
            for name in [n for n in self.files if n == path or n.startswith(under)]:
                del self.files[name]

    def lines(self) -> bytes:
        out = []
        for path, f in self.files.items():
            if f.created:
                out.append(f"{CREATED} 0 {path}\n")
            out.append(f"{DURABLE} {f.durable} {path}\n")
            if f.allocated:
                out.append(f"{ALLOCATED} {f.allocated} {path}\n")
        return "".join(out).encode()


class Ledger:
    def __init__(self, data_dir: str):
        self.path = os.path.join(os.path.abspath(data_dir), LEDGER_NAME)
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        self._state = _read_state(self.path)
        self._lock = threading.Lock()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self._bytes = os.fstat(self._fd).st_size

    @property
    def root(self) -> str:
        """The node's data directory, where the ledger lives."""
        return os.path.dirname(self.path)

    def durable(self, path: str) -> int | None:
        """How far ``path`` is durable; None for a file the ledger has never heard of."""
        with self._lock:
            f = self._state.files.get(path)
            return f.durable if f is not None else None

    def record(self, kind: str, number: int, path: str) -> None:
        path = os.path.abspath(path)
        line = f"{kind} {number} {path}\n".encode()
        with self._lock:
            self._state.apply(kind, number, path)
            os.write(self._fd, line)   # one write of one line: a kill -9 keeps it whole or not at all
            self._bytes += len(line)
            if self._bytes > LEDGER_COMPACT_BYTES:
                self._compact()

    def _compact(self) -> None:
        body = self._state.lines()
        tmp = self.path + ".tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            view = memoryview(body)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        os.replace(tmp, self.path)   # atomic for a kill -9: the old ledger or the new one
        os.close(self._fd)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        self._bytes = len(body)

    def close(self) -> None:
        os.close(self._fd)


# The one switch every writer's hook checks: empty (production, and tests that do not ask) costs one test. A node's
# ledger, by its data directory; several in one process are the simulator's brokers (ops/sim/brokers.py).
_ledgers: dict[str, Ledger] = {}


def enable(data_dir: str) -> Ledger:
    led = Ledger(data_dir)
    _ledgers[led.root] = led
    return led


def disable(data_dir: str | None = None) -> None:
    """The ledger of ``data_dir`` (every one, by default) closed: its node's syncs are no longer recorded."""
    roots = list(_ledgers) if data_dir is None else [os.path.abspath(data_dir)]
    for root in roots:
        led = _ledgers.pop(root, None)
        if led is not None:
            led.close()


def ledger_for(path: str) -> Ledger | None:
    """The ledger of the data directory ``path`` lies in, if the mode is on for it."""
    if not _ledgers:
        return None
    path = os.path.abspath(path)
    for root, led in _ledgers.items():
        if path == root or path.startswith(root + os.sep):
            return led
    return None


# Hooks for the writers. Each does nothing beyond the system call when the mode is off.

def sync_fd(fd: int, sync: Callable[[int], None] = os.fdatasync, written: int | None = None) -> None:
    """``sync(fd)``, then, with the mode on, the record that the file is durable up to its size before the sync, or
    up to ``written`` for a file with space allocated ahead (``allocated``), whose size says nothing of its data."""
    if not _ledgers:
        sync(fd)
        return
    size = os.fstat(fd).st_size if written is None else written
    sync(fd)
    path = _fd_path(fd)
    current = ledger_for(path) if path is not None else None
    if current is not None and path is not None:
        current.record(DURABLE, size, path)


def sync_filesystem(fd: int, syncfs: Callable[[int], None]) -> None:
    """``syncfs(fd)``, then, with the mode on, a record for every file under the node's data directory that grew
    since the ledger last saw it durable: each is durable up to its size before the call began. Walking the
    directory rather than asking the caller which files it meant is the point: a file the code forgot, or wrote
    after the call began, is not covered."""
    path = _fd_path(fd) if _ledgers else None
    current = ledger_for(path) if path is not None else None
    if current is None:
        syncfs(fd)
        return
    sizes = _sizes_under(current.root, skip=(current.path, current.path + ".tmp"))
    syncfs(fd)
    for path, size in sizes.items():
        durable = current.durable(path)
        if durable is None or size > durable:   # an empty file too: known from now on, so cut if it grows unsynced
            current.record(SYNCED_AT_LEAST, size, path)


def _sizes_under(root: str, skip: tuple[str, ...]) -> dict[str, int]:
    """The size of every regular file under ``root`` (one that vanishes meanwhile is left out)."""
    sizes: dict[str, int] = {}
    stack = [root]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                elif entry.is_file(follow_symlinks=False) and entry.path not in skip:
                    sizes[entry.path] = entry.stat(follow_symlinks=False).st_size
            except OSError:
                continue
    return sizes


def allocated(fd: int, size: int) -> None:
    """The file of ``fd`` has space allocated ahead up to ``size`` bytes, read as zeros past its data (0: none any
    more, it was cut to its data). Durable with its next sync, as the size change it is."""
    if _ledgers:
        path = _fd_path(fd)
        if path is not None:
            _record(ALLOCATED, size, path)


def synced_whole(path: str) -> None:
    """``path`` was replaced by a synced file (write, fsync, rename): it is never cut. A rename is atomic, so after a
    power loss the path holds the old file or the new one, each synced whole; recorded by its length, a kill
    between the rename and this record cut the new file to the old one's length and tore it (a meta node then
    refused its damaged raft.state: a harness-made fault, found by the mutants' control run)."""
    _record(DURABLE, WHOLE, path)


def created(path: str) -> None:
    _record(CREATED, 0, path)


def dir_synced(path: str) -> None:
    _record(DIR_SYNCED, 0, path)


def removed(path: str) -> None:
    _record(REMOVED, 0, path)


def _record(kind: str, number: int, path: str) -> None:
    current = ledger_for(path)
    if current is not None:
        current.record(kind, number, path)


def _fd_path(fd: int) -> str | None:
    """The path the descriptor was opened at (Linux); None once the file was unlinked (nothing left to cut)."""
    try:
        path = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None
    return None if path.endswith(" (deleted)") else path


# After the process is gone.

@dataclass
class Loss:
    files_cut: int = 0
    files_removed: int = 0
    bytes_lost: int = 0
    torn: int = 0              # files left with a piece of their lost tail

    def as_dict(self) -> dict[str, int]:
        return {"files_cut": self.files_cut, "files_removed": self.files_removed, "bytes_lost": self.bytes_lost,
                "torn": self.torn}


def unsynced_bytes(data_dir: str) -> int:
    """What ``lose_unsynced`` would take from a *stopped* (or paused) node's data directory now, torn pieces aside:
    0 when every byte the node wrote is durable."""
    return sum(size - (0 if created else durable) for _, size, durable, created, _ in _at_risk(data_dir))


def lose_unsynced(data_dir: str, rng: random.Random, tear: bool) -> Loss:
    """On a *stopped* node's data directory: cut every file the ledger knows back to its durable length (with
    ``tear``, keep a random piece of each lost tail, as a write cut mid-way leaves), remove files created since
    their directory's last sync, then reset the ledger. A directory without a ledger (the mode was off, or the node
    never started) loses nothing."""
    loss = Loss()
    for name, size, durable, created, ahead in _at_risk(data_dir):
        if created:
            os.remove(name)
            loss.files_removed += 1
            loss.bytes_lost += size
            continue
        keep = durable
        lost = size - keep
        if tear and lost > 1:
            keep += rng.randint(1, min(lost - 1, TEAR_BYTES_MAX))
            loss.torn += 1
        if ahead:
            _zero(name, keep, size)   # its allocated size is durable: the blocks lost read as zeros
        else:
            os.truncate(name, keep)
        loss.files_cut += 1
        loss.bytes_lost += size - keep
    path = os.path.join(os.path.abspath(data_dir), LEDGER_NAME)
    if os.path.exists(path):
        os.remove(path)
    return loss


def _at_risk(data_dir: str) -> list[tuple[str, int, int, bool, bool]]:
    """Every file a power loss would change now, in path order: (path, size, durable length, created since its
    directory's last sync, space allocated ahead). The size of a file with space allocated ahead is where its data
    ends (its last byte that is not zero)."""
    path = os.path.join(os.path.abspath(data_dir), LEDGER_NAME)
    if not os.path.exists(path):
        return []
    state = _read_state(path)
    out = []
    for name in sorted(state.files):
        f = state.files[name]
        try:
            size = _data_end(name, f.durable) if f.allocated else os.stat(name).st_size
        except FileNotFoundError:
            continue
        if f.created or size > f.durable:
            out.append((name, size, f.durable, f.created, bool(f.allocated)))
    return out


def _data_end(path: str, durable: int) -> int:
    """Where the data of a file with space allocated ahead ends: after its last byte that is not zero, at least
    ``durable`` (its synced data may end in zeros)."""
    end = durable
    with open(path, "rb") as f:
        at = durable
        f.seek(at)
        while chunk := f.read(ZEROS_CHUNK_BYTES):
            kept = len(chunk.rstrip(b"\0"))
            if kept:
                end = at + kept
            at += len(chunk)
    return end


def _zero(path: str, start: int, end: int) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        while start < end:
            start += os.pwrite(fd, bytes(min(end - start, ZEROS_CHUNK_BYTES)), start)
    finally:
        os.close(fd)


def _read_state(path: str) -> _State:
    state = _State()
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return state
    for line in raw.decode("utf-8", "replace").splitlines():
        parts = line.split(" ", 2)
        if len(parts) == 3 and parts[0] in KINDS and parts[1].isdigit():
            state.apply(parts[0], int(parts[1]), parts[2])
    return state
