"""File names inside a queue directory and the few durable file-system steps storage needs."""

from __future__ import annotations

import ctypes
import errno
import os
import re

from runtime import libc, power_loss

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TMP_SUFFIX = ".tmp"
CLEAN_MARKER = "clean-shutdown.json"
_LOG_NAME = re.compile(r"^(\d{20})\.log$")
_INDEX_NAME = re.compile(r"^(\d{20})\.index$")

O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def log_name(base: int) -> str:
    return f"{base:020d}{LOG_SUFFIX}"


def index_name(base: int) -> str:
    return f"{base:020d}{INDEX_SUFFIX}"


def parse_log_name(name: str) -> int | None:
    match = _LOG_NAME.match(name)
    return int(match.group(1)) if match else None


def parse_index_name(name: str) -> int | None:
    match = _INDEX_NAME.match(name)
    return int(match.group(1)) if match else None


def sync_data(fd: int) -> None:
    # fdatasync skips metadata that reading the data back does not need (mtime); the size is still flushed.
    # Every fsync of storage's data goes through here: the power-loss ledger (tests only) records it.
    # Harmless mutants: fsync always, or fdatasync always (durable either way; Linux has both, fsync is slower)
    power_loss.sync_fd(fd, os.fdatasync if hasattr(os, "fdatasync") else os.fsync)


_syncfs = libc.function("syncfs", [ctypes.c_int])   # glibc 2.14 and later
SYNCFS_ERRORS_SINCE = (5, 8)   # Linux reports write-back errors to syncfs from this release on


def syncfs_unusable() -> str | None:
    """Why sync_filesystem cannot be trusted here, or None. Before Linux 5.8 syncfs returned 0 after a write-back
    error, so a broker would acknowledge records the disk had failed to store."""
    if _syncfs is None:
        return "this system has no syncfs(2) (Linux only)"
    release = os.uname().release
    found = re.match(r"(\d+)\.(\d+)", release)
    if found is None or (int(found.group(1)), int(found.group(2))) < SYNCFS_ERRORS_SINCE:
        return f"Linux {release} does not report write-back errors to syncfs(2) (5.8 and later do)"
    return None


def sync_filesystem(fd: int) -> None:
    """syncfs(2) of the file system holding `fd`: every dirty page and inode on it, in one journal commit and one
    flush of the device's cache. Since Linux 5.8 it reports a writeback error of any file there (once per open
    descriptor), which is why the caller keeps one descriptor open for its life. The GIL is released meanwhile
    (ctypes). The power-loss ledger (tests only) records what it covered."""
    power_loss.sync_filesystem(fd, _checked_syncfs)


def _checked_syncfs(fd: int) -> None:
    if _syncfs(fd) != 0:
        err = libc.errno()
        raise OSError(err, f"syncfs: {os.strerror(err)}")


class WouldWait(Exception):
    """A read asked not to wait found its bytes not (all) in the page cache: read them on a thread instead."""


def pread_cached(fd: int, size: int, pos: int) -> bytes:
    """os.pread of what the page cache holds, never waiting for the disk (preadv2 with RWF_NOWAIT, Linux 4.14 and
    later): WouldWait when any of it would have to be read from the disk, or the file system cannot tell."""
    buf = bytearray(size)
    try:
        got = os.preadv(fd, [buf], pos, os.RWF_NOWAIT)
    except BlockingIOError:
        raise WouldWait from None
    except OSError as err:
        if err.errno in (errno.EOPNOTSUPP, errno.EINVAL):
            raise WouldWait from None
        raise
    if got < size:   # the rest is not cached (or the file is shorter: the waiting read decides what that means)
        raise WouldWait
    return bytes(buf)


def sync_dir(path: str) -> None:
    """Makes creations, renames and deletions of entries in `path` durable."""
    # Harmless mutant: ``&`` (O_CLOEXEC lost: the descriptor is closed before this returns)
    fd = os.open(path, os.O_RDONLY | O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    power_loss.dir_synced(path)


def write_all(fd: int, data: bytes) -> None:
    """Writes all of ``data``: os.write may write less than it was given."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def open_lines(path: str, whole: int) -> int:
    """An append descriptor of a checked-lines file (storage/lines.py) read ``whole`` bytes long (-1: no file): a
    new file's directory entry is made durable, and a torn tail after ``whole`` is cut off, or the next line would be
    glued to it and lost with it on the following read."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | O_CLOEXEC, 0o644)
    try:
        if whole < 0:
            sync_dir(os.path.dirname(path))
        elif whole < os.fstat(fd).st_size:   # harmless mutant: <= (cuts nothing, syncs once more)
            os.ftruncate(fd, whole)
            sync_data(fd)
    except BaseException:
        os.close(fd)
        raise
    return fd


def replace_lines(path: str, body: bytes, fd: int) -> int:
    """Replaces the file ``fd`` appends to with ``body`` (a compaction), durably, rename included; returns the
    descriptor to append to from now on (``fd`` is closed)."""
    write_atomic(path, body)
    sync_dir(os.path.dirname(path))
    new = os.open(path, os.O_WRONLY | os.O_APPEND | O_CLOEXEC)
    os.close(fd)
    return new


def write_atomic(path: str, data: bytes) -> None:
    """Replaces `path` with `data`; a crash leaves the old or the new content. The caller syncs the directory."""
    tmp = path + TMP_SUFFIX
    # Harmless mutants: another mode (the broker alone reads its files)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | O_CLOEXEC, 0o644)
    try:
        write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    power_loss.synced_whole(path)


def read_file(path: str) -> bytes | None:
    """The file's content, or None when there is no such file (a directory in its place counts as none)."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except (FileNotFoundError, IsADirectoryError):
        return None


def remove_if_exists(path: str) -> bool:
    try:
        os.unlink(path)
        power_loss.removed(path)
        return True
    except FileNotFoundError:
        return False
