"""Projection writers forked from a process that has imported their code already, rather than started afresh.

A writer started as ``python -m meta.projection.writer_process`` spends ~0.45 s of CPU importing SQLAlchemy and the
store before it answers; every meta node starts one, and the test suite starts several hundred nodes (with
ops/forkserver.py the nodes themselves no longer pay their imports, so the writers' were the largest start-up cost
left). A node forks this zygote first thing, while it has one thread (a fork copies only the calling thread; no
other thread's lock can be caught held): the zygote then waits on a socket, and for each request forks one writer,
which closes every descriptor but its standard ones and the connection it was handed (SCM_RIGHTS), and serves it as
``writer_process.serve`` does for a started one. The writers are the zygote's children, not the node's: the node
watches each through a pidfd (``Child``), and the zygote lets the kernel reap them (SIGCHLD ignored). The zygote
ends when the node's end of its socket closes (the node exited, however it died).

Where a zygote cannot be had (a node with threads already, as in tests that run a node in process), writers are
started as before (``writer_process.WriterProcess`` falls back to ``subprocess``).
"""

from __future__ import annotations

import ctypes
import importlib
import os
import select
import signal
import socket
import struct
import subprocess
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection

import structlog

log = structlog.get_logger("meta.projection")

PID = struct.Struct("<q")       # the zygote's answer: the writer's pid, or -errno
SPAWN_TIMEOUT_S = 10.0          # the zygote answers at once (a fork); longer means it is gone or stuck
FD_LIMIT = 1 << 20             # closerange's end: above any descriptor a node opens (close_range(2) skips holes)
# Process names (/proc/PID/comm, 15 bytes at most). The zygote and its writers are forks with the node's command line,
# as pysyncobj's snapshot writers are: their names are how ps, top and ops/bench/scale.py tell them apart.
ZYGOTE_NAME = "stator-zygote"
WRITER_NAME = "stator-projwr"
PR_SET_NAME = 15               # prctl(2)


class ZygoteError(RuntimeError):
    pass


class Child:
    """A writer the zygote forked: alive until its pidfd says it exited (its exit code is the zygote's to reap)."""

    def __init__(self, pid: int):
        self.pid = pid
        self._fd = os.pidfd_open(pid)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and select.select([self._fd], [], [], 0)[0]:
            self.returncode = -1   # exited; how is not known here
            os.close(self._fd)
        return self.returncode

    def wait(self, timeout_s: float) -> None:
        if self.returncode is None:
            if not select.select([self._fd], [], [], timeout_s)[0]:
                raise subprocess.TimeoutExpired(f"projection writer {self.pid}", timeout_s)
            self.poll()

    def kill(self) -> None:
        if self.poll() is None:
            try:   # through the pidfd: never another process that took the pid over
                signal.pidfd_send_signal(self._fd, signal.SIGKILL)
            except ProcessLookupError:
                pass   # it exited since the poll


class Zygote:
    def __init__(self, sock: socket.socket, pid: int):
        self._sock = sock
        self.pid = pid
        self._lock = threading.Lock()
        self._broken = False

    def spawn(self, conn_fd: int) -> Child:
        """A writer serving the connection ``conn_fd`` (the caller keeps and closes its own copy). After any
        failure but a failed fork the zygote is not asked again: a late answer would be taken for the next one's."""
        with self._lock:
            if self._broken:
                raise ZygoteError("the projection writers' zygote failed before")
            try:
                socket.send_fds(self._sock, [b"w"], [conn_fd])
                ready = select.select([self._sock], [], [], SPAWN_TIMEOUT_S)[0]
                answer = self._sock.recv(PID.size) if ready else b""
            except OSError as e:
                self._broken = True
                raise ZygoteError(f"the projection writers' zygote went away: {e!r}") from None
            if len(answer) != PID.size:
                self._broken = True
                raise ZygoteError("the projection writers' zygote did not answer")
        (pid,) = PID.unpack(answer)
        if pid <= 0:
            raise ZygoteError(f"the projection writers' zygote could not fork: {os.strerror(-pid)}")
        return Child(pid)


_zygote: Zygote | None = None
_owner_pid: int | None = None


def start(serve: Callable[[Connection], None]) -> Zygote | None:
    """Fork the zygote, once per process, while the process has one thread; None (writers start afresh) if not.
    Each writer it forks runs ``serve`` on its connection (``writer_process.serve``)."""
    global _zygote, _owner_pid
    if _zygote is not None and _owner_pid == os.getpid():
        return _zygote
    if threading.active_count() != 1:
        log.info("projection_writer_zygote_skipped", threads=threading.active_count())
        return None
    importlib.import_module("meta.projection.store")   # what every writer runs, once here (the node's is lazy)
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            mine.close()
            code = _serve_requests(theirs, serve)
        finally:
            os._exit(code)
    theirs.close()
    _zygote, _owner_pid = Zygote(mine, pid), os.getpid()
    return _zygote


def current() -> Zygote | None:
    """This process's zygote, if it forked one (a forked child of the node has none of its own)."""
    return _zygote if _owner_pid == os.getpid() else None


def name_this_process(name: str) -> None:
    """Set this (single-threaded) process's name; best effort: the node itself never goes by it."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _serve_requests(sock: socket.socket, serve: Callable[[Connection], None]) -> int:
    name_this_process(ZYGOTE_NAME)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)   # writers are reaped by the kernel
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)    # a ^C of the node's terminal is the node's to act on
    while True:
        try:
            _msg, fds, _flags, _addr = socket.recv_fds(sock, 1, 1)
        except OSError:
            return 0
        if not fds:
            return 0   # the node closed its end: it is gone
        try:
            pid = os.fork()
        except OSError as e:
            os.close(fds[0])
            sock.sendall(PID.pack(-e.errno))
            continue
        if pid == 0:
            _run_writer(sock, fds[0], serve)
        os.close(fds[0])
        sock.sendall(PID.pack(pid))


def _run_writer(zygote_sock: socket.socket, conn_fd: int, serve: Callable[[Connection], None]) -> None:
    code = 1
    try:
        name_this_process(WRITER_NAME)
        zygote_sock.close()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        # Nothing of the node's stays open here (its journal, listening sockets, the zygote's socket): only the
        # standard streams (the node's log) and the connection, as subprocess's close_fds would leave them.
        if conn_fd > 3:
            os.closerange(3, conn_fd)
        os.closerange(max(conn_fd + 1, 3), FD_LIMIT)
        serve(Connection(conn_fd))
        code = 0
    finally:
        os._exit(code)
