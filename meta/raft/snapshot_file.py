"""The Raft snapshot file: the image, plus the two log entries the log must still start with, as gzip'd JSON.

Never a pickle: a follower installs the file the leader streams to it and the offline tools read it back, so it is
data that gets parsed and checked, not objects that get revived (DESIGN.md invariant 10). The layout::

    {"format": "stator-raft-snapshot", "version": 3,
     "image": {... Image.data ...},
     "raft": {"last_applied": {"index": int, "term": int, "command": base64},
              "previous":     {"index": int, "term": int, "command": base64},
              "cluster": ["host:port", ...]}}

``last_applied`` is the entry the image includes last; ``command`` is pysyncobj's own bytes for the entry, kept
verbatim because the log a follower receives after the snapshot must match the leader's. JSON keeps the image's
dict order, which is itself state (``Image.canonical_bytes``).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import enum
import gc
import gzip
import io
import json
import os
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NoReturn

FORMAT = "stator-raft-snapshot"
FORMAT_VERSION = 3   # 2: each broker of the image names its disk (wire/disk_identity.py); 3: a remembered
                     # request's outcome is its JSON text (meta/state_machine.py _remember)
GZIP_LEVEL = 6                # most of level 9's saving for a fraction of its CPU
SNAPSHOT_WRITER_NICE = 19     # the writer must never compete with Raft for the CPU
WRITING_SUFFIX = ".writing"   # the file being written; renamed over the snapshot only once complete and synced
EXIT_WRITE_FAILED = 1
ENCODE_SPLIT_DEPTH = 4        # objects above this depth (document > image > topics > topic) go key by key
ENCODE_SLICE_ITEMS = 1024     # a longer list is encoded this many items at a time
PICKLE_PROTOCOL_OPCODE = b"\x80"  # how pysyncobj's own (pickled) snapshots begin


class SnapshotFormatError(ValueError):
    pass


@dataclass(frozen=True)
class LogEntry:
    index: int
    term: int
    command: bytes


@dataclass(frozen=True)
class Snapshot:
    image: dict[str, Any]
    last_applied: LogEntry
    previous: LogEntry
    cluster: tuple[str, ...]


# -- format ----------------------------------------------------------------------------------------------------
def encode(snapshot: Snapshot) -> bytes:
    return "".join(_chunks(_document(snapshot))).encode()


def _document(snapshot: Snapshot) -> dict[str, Any]:
    return {"format": FORMAT, "version": FORMAT_VERSION, "image": snapshot.image,
            "raft": {"last_applied": _entry_doc(snapshot.last_applied), "previous": _entry_doc(snapshot.previous),
                     "cluster": list(snapshot.cluster)}}


_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode


def _chunks(value: Any, depth: int = 0) -> Iterator[str]:
    """The JSON text of ``value`` in pieces of bounded size: one piece per key of the outer objects (the document,
    the image, its maps, each topic) and per slice of a long list (a topic's queues, the history). Encoding a
    million-queue image in one piece would hold its whole text twice (str and bytes) in the writer's memory."""
    if isinstance(value, dict) and depth < ENCODE_SPLIT_DEPTH:
        yield "{"
        separator = ""
        for key, item in value.items():
            yield separator + _dumps(key) + ":"
            separator = ","
            yield from _chunks(item, depth + 1)
        yield "}"
    elif isinstance(value, list) and len(value) > ENCODE_SLICE_ITEMS:
        yield "["
        for start in range(0, len(value), ENCODE_SLICE_ITEMS):
            yield ("," if start else "") + _dumps(value[start:start + ENCODE_SLICE_ITEMS])[1:-1]
        yield "]"
    else:
        yield _dumps(value)


def decode(raw: bytes, object_pairs_hook: Callable[[list[tuple[str, Any]]], Any] | None = None) -> Snapshot:
    """``object_pairs_hook`` (json's) sees each object as it is parsed: the image compacts each topic there, so a
    big image is never held whole in its parsed, uncompacted form (meta/image.py ``restoring_pairs``)."""
    if raw[:1] == PICKLE_PROTOCOL_OPCODE:
        raise SnapshotFormatError("a pickled snapshot, the format of older versions, which is never unpickled: stop "
                                  "the node, move its raft.snapshot and raft.journal aside and restart it, so that it "
                                  "installs the leader's snapshot")
    try:
        doc = json.loads(raw, object_pairs_hook=object_pairs_hook)
    except (ValueError, RecursionError) as e:
        raise SnapshotFormatError(f"not JSON: {e}") from None
    _keys(doc, {"format", "version", "image", "raft"}, "the snapshot")
    if doc["format"] != FORMAT or doc["version"] != FORMAT_VERSION:
        raise SnapshotFormatError(f"not a {FORMAT} version {FORMAT_VERSION} file: "
                                  f"{str(doc['format'])[:100]!r} version {str(doc['version'])[:20]!r}")
    image = doc["image"]
    if not isinstance(image, dict) or not _is_index(image.get("version")):
        raise SnapshotFormatError("image must be an object with a version")
    raft = doc["raft"]
    _keys(raft, {"last_applied", "previous", "cluster"}, "raft")
    last, previous = _entry(raft["last_applied"], "last_applied"), _entry(raft["previous"], "previous")
    if previous.index + 1 != last.index:
        raise SnapshotFormatError(f"raft.previous ({previous.index}) must directly precede "
                                  f"raft.last_applied ({last.index})")
    cluster = raft["cluster"]
    if not isinstance(cluster, list) or not all(isinstance(a, str) for a in cluster):
        raise SnapshotFormatError("raft.cluster must be a list of node addresses")
    return Snapshot(image, last, previous, tuple(cluster))


def _entry_doc(entry: LogEntry) -> dict[str, Any]:
    return {"index": entry.index, "term": entry.term, "command": base64.b64encode(entry.command).decode("ascii")}


def _entry(doc: Any, where: str) -> LogEntry:
    _keys(doc, {"index", "term", "command"}, f"raft.{where}")
    if not _is_index(doc["index"]) or not _is_index(doc["term"]) or not isinstance(doc["command"], str):
        raise SnapshotFormatError(f"raft.{where} needs a non-negative index and term and a base64 command")
    try:
        command = base64.b64decode(doc["command"], validate=True)
    except (binascii.Error, ValueError):
        raise SnapshotFormatError(f"raft.{where}.command is not base64") from None
    return LogEntry(doc["index"], doc["term"], command)


def _keys(doc: Any, expected: set[str], where: str) -> None:
    if not isinstance(doc, dict) or set(doc) != expected:
        found = sorted(doc)[:20] if isinstance(doc, dict) else type(doc).__name__
        raise SnapshotFormatError(f"{where} must be an object with exactly {sorted(expected)}, found {found}")


def _is_index(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


# -- files -----------------------------------------------------------------------------------------------------
def read(path: str, object_pairs_hook: Callable[[list[tuple[str, Any]]], Any] | None = None) -> Snapshot:
    """The snapshot at ``path``; a missing file raises FileNotFoundError, anything unreadable SnapshotFormatError."""
    try:
        with gzip.open(path, "rb") as f:
            raw = f.read()
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise SnapshotFormatError(f"{path} is not a complete gzip file: {e}") from None
    try:
        with _cyclic_gc_paused():
            return decode(raw, object_pairs_hook)
    except SnapshotFormatError as e:
        raise SnapshotFormatError(f"{path}: {e}") from None


@contextlib.contextmanager
def _cyclic_gc_paused() -> Iterator[None]:
    # Parsing a large image allocates millions of containers, and every burst of allocations starts a collection
    # that walks all of them again: about half the load time. What JSON builds is acyclic, so nothing is missed.
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def write(path: str, snapshot: Snapshot) -> None:
    """Replaces ``path`` atomically: a crash leaves the old snapshot or the new one, never a part."""
    write_beside(path, snapshot)
    put_in_place(path)


def write_beside(path: str, snapshot: Snapshot) -> str:
    """Writes the snapshot whole and synced next to ``path`` (``path + WRITING_SUFFIX``); returns that name."""
    tmp = path + WRITING_SUFFIX
    with open(tmp, "wb") as f:
        with gzip.GzipFile(fileobj=f, mode="wb", compresslevel=GZIP_LEVEL, mtime=0) as g, \
                io.TextIOWrapper(g, encoding="utf-8", newline="") as text:
            text.writelines(_chunks(_document(snapshot)))
        f.flush()
        # pysyncobj drops the log entries the snapshot covers once the write reports success: the file must be
        # on disk by then, not in the page cache.
        os.fsync(f.fileno())
    return tmp


def put_in_place(path: str) -> None:
    """Renames the synced ``path + WRITING_SUFFIX`` over ``path`` and syncs the directory."""
    os.replace(path + WRITING_SUFFIX, path)
    sync_directory_of(path)


def sync_file(path: str) -> None:
    """fsync ``path`` and its directory: a file another writer renamed into place (pysyncobj's install) is durable."""
    with open(path, "rb") as f:
        os.fsync(f.fileno())
    sync_directory_of(path)


def sync_directory_of(path: str) -> None:
    dir_fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class WriterState(enum.Enum):
    IDLE = "idle"
    WRITING = "writing"
    DONE = "done"
    FAILED = "failed"


class BackgroundWriter:
    """Writes one snapshot at a time from a forked child; the parent puts it in place.

    Encoding a million-queue image takes seconds of CPU the tick must not spend (it would miss heartbeats
    and cause elections); the child's copy-on-write view of memory is a consistent image at no cost.

    The child only writes ``path + WRITING_SUFFIX``; ``poll``, on the tick, renames it over the snapshot. The
    tick is also where a snapshot installed from the leader lands (``note_on_disk``), so the two never race:
    a write of index L that finishes after a newer snapshot (index L' > L) was installed is dropped, never renamed
    over it. Renamed from the child, it replaced the installed one while the journal already started at L': on
    restart the journal no longer followed the snapshot and every entry after L was lost from the node.
    """

    def __init__(self, path: str):
        self.path = path
        self._pid: int | None = None
        self._writing_index = 0
        self._fork_failed = False
        self.on_disk_index = 0     # last applied index of the snapshot file in place (0: none known)
        self.superseded = 0        # writes dropped because a newer snapshot was installed meanwhile

    @property
    def pid(self) -> int | None:
        """The writing child's process id, while there is one."""
        return self._pid

    def note_on_disk(self, index: int) -> None:
        """The snapshot in place now covers up to ``index`` (read at start-up or installed from the leader)."""
        self.on_disk_index = index

    def start(self, snapshot: Snapshot) -> bool:
        """Starts a write; False if one is still running or no child could be forked (``poll`` reports FAILED)."""
        if self._pid is not None:
            return False
        try:
            pid = os.fork()
        except OSError:
            self._fork_failed = True
            return False
        if pid == 0:
            _write_in_child(self.path, snapshot)
        self._pid = pid
        self._writing_index = snapshot.last_applied.index
        return True

    def poll(self) -> WriterState:
        """The state of the last write; DONE and FAILED are reported once, then the writer is IDLE again."""
        if self._pid is None:
            failed, self._fork_failed = self._fork_failed, False
            return WriterState.FAILED if failed else WriterState.IDLE
        try:
            pid, status = os.waitpid(self._pid, os.WNOHANG)
        except ChildProcessError:  # reaped by someone else: its outcome is unknown, so the write does not count
            self._pid = None
            return WriterState.FAILED
        if pid == 0:
            return WriterState.WRITING
        self._pid = None
        if os.waitstatus_to_exitcode(status) != 0:
            return WriterState.FAILED
        if self._writing_index <= self.on_disk_index:
            self.superseded += 1
            with contextlib.suppress(FileNotFoundError):
                os.remove(self.path + WRITING_SUFFIX)
            return WriterState.FAILED
        put_in_place(self.path)
        self.on_disk_index = self._writing_index
        return WriterState.DONE


def _write_in_child(path: str, snapshot: Snapshot) -> NoReturn:
    code = EXIT_WRITE_FAILED
    try:
        # A collection would touch every tracked object's header and copy the parent's memory page by page.
        gc.disable()
        with contextlib.suppress(OSError):
            os.nice(SNAPSHOT_WRITER_NICE)
        write_beside(path, snapshot)
        code = 0
    except BaseException as e:  # the child must never return into the parent's code, whatever happens
        with contextlib.suppress(BaseException):
            os.write(2, f"raft snapshot write to {path} failed: {e!r}\n".encode())
    finally:
        os._exit(code)
