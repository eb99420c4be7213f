"""The projection's writes in a process of their own: ``WriterProcess`` answers the calls of ``SqlProjection`` that
write (migrate, apply) and those that tell where it stands (position, first_hole, history), run by a child process;
``gc_state`` says how the child set its cyclic collector (``serve``).

Why: folding events into rows is a burst of short-lived Python objects per event (a 1,000-queue topic's creation is a
row per segment), made by a worker thread while the apply thread makes the image's long-lived ones. Interleaved, the
long-lived objects pin the allocator's arenas of the short-lived ones: at 300,000 queues a node held ~110 MiB more
than its image and caches needed, all of it the projection's (measured with the projection task off: gone). In a
process of its own the projection's garbage is its own, and its CPU (7-11 % of a node's samples) leaves the
node's GIL. Reads of history stay in the node (``SqlProjection.history``): they are rare, and must not queue
behind a batch being written.

In a node the child is forked by the node's writer zygote (``writer_zygote``: no imports to pay). Elsewhere (a node
run in process, with threads already) it is ``python -m meta.projection.writer_process FD``, started with a socket
of its own (not multiprocessing's spawn, which would import the node's whole ``__main__`` again). Either way the
database URL goes over the socket, never on a command line (it may hold a password). Calls are one at a time, each
with a timeout. A child that died is started again by the next call; a node that dies closes the socket, and the
child exits.
"""

from __future__ import annotations

import gc
import socket
import subprocess
import sys
import threading
from multiprocessing.connection import Connection
from typing import Any

import structlog

from ..gc_tuning import GC_THRESHOLDS
from . import writer_zygote

log = structlog.get_logger("meta.projection")

START_TIMEOUT_S = 60.0        # the child's imports and its database connection
CALL_TIMEOUT_S = 600.0        # one apply of APPLY_BATCH_MAX events of big topics on a slow disk
STOP_TIMEOUT_S = 10.0
CALLS = ("migrate", "position", "first_hole", "apply", "apply_lines", "history")


class WriterProcessError(RuntimeError):
    """The writer process did not answer (died, timed out, or could not start); the call may be tried again."""


class WriterProcess:
    def __init__(self, url: str, log_level: str = "info", **identity: str):
        self._url = url
        self._logging = {"level": log_level, **identity, "process": "projection-writer"}
        self._lock = threading.Lock()   # one call at a time: calls come from executor threads
        self._proc: subprocess.Popen | writer_zygote.Child | None = None
        self._conn: Connection | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    # -- the calls ---------------------------------------------------------------------------------------------
    def migrate(self) -> None:
        self._call("migrate")

    def position(self) -> int:
        return self._call("position")

    def first_hole(self) -> tuple[int, int] | None:
        hole = self._call("first_hole")
        return tuple(hole) if hole is not None else None

    def apply(self, events: list[dict[str, Any]]) -> int:
        return self._call("apply", events)

    def apply_lines(self, lines: list[str]) -> int:
        """``apply`` of stored events as the image keeps them (JSON text): parsed in the child."""
        return self._call("apply_lines", lines)

    def gc_state(self) -> tuple[int, tuple[int, int, int]]:
        """(objects kept out of the child's collections, its collection thresholds): how ``serve`` set them."""
        return self._call("gc_state")

    def history(self, after: int = 0, topic: str | None = None, limit: int = 1000,
                through: int | None = None) -> list[dict[str, Any]]:
        """For the gap filler's check of its last event; the node's readers use a connection of their own."""
        return self._call("history", after, topic, limit, through)

    def close(self) -> None:
        with self._lock:
            self._stop()

    # -- the child ---------------------------------------------------------------------------------------------
    def _call(self, name: str, *args: Any) -> Any:
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                if self._proc is not None:
                    log.warning("projection_writer_restarted", exit_code=self._proc.returncode)
                self._start()
            try:
                self._conn.send((name, args))
                if not self._conn.poll(CALL_TIMEOUT_S):
                    self._stop()
                    raise WriterProcessError(f"the projection writer did not answer {name} within {CALL_TIMEOUT_S} s")
                ok, value = self._conn.recv()
            except (OSError, EOFError) as e:
                self._stop()
                raise WriterProcessError(f"the projection writer went away during {name}: {e!r}") from None
        if not ok:
            raise value
        return value

    def _start(self) -> None:
        mine, theirs = socket.socketpair()
        try:
            self._proc = None
            zygote = writer_zygote.current()   # forked from it: no imports to pay (meta/projection/writer_zygote.py)
            if zygote is not None:
                try:
                    self._proc = zygote.spawn(theirs.fileno())
                except writer_zygote.ZygoteError as e:   # killed by hand, say: the writer still starts
                    log.warning("projection_writer_zygote_failed", error=str(e))
            if self._proc is None:
                self._proc = subprocess.Popen([sys.executable, "-m", "meta.projection.writer_process",
                                               str(theirs.fileno())], pass_fds=[theirs.fileno()],
                                              stdin=subprocess.DEVNULL)
        finally:
            theirs.close()
        self._conn = Connection(mine.detach())
        self._conn.send((self._url, self._logging))
        if not self._conn.poll(START_TIMEOUT_S):
            self._stop()
            raise WriterProcessError(f"the projection writer did not start within {START_TIMEOUT_S} s")
        try:
            ok, value = self._conn.recv()
        except (OSError, EOFError) as e:
            self._stop()
            raise WriterProcessError(f"the projection writer failed to start: {e!r}") from None
        if not ok:
            self._stop()
            raise value

    def _stop(self) -> None:
        if self._conn is not None:
            try:
                self._conn.send(None)
            except OSError:
                pass
            self._conn.close()
            self._conn = None
        if self._proc is not None:
            try:
                self._proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(STOP_TIMEOUT_S)


# -- in the child ----------------------------------------------------------------------------------------------------
def _answer_error(conn: Connection, e: BaseException) -> None:
    try:
        conn.send((False, e))
    except Exception:  # noqa: BLE001 - an exception that does not pickle still reaches the caller, as text
        conn.send((False, RuntimeError(f"{type(e).__name__}: {e}")))


def serve(conn: Connection) -> None:
    from meta.projection.store import SqlProjection
    from runtime.logging import configure
    url, logging = conn.recv()
    configure(**logging)   # the node's JSON lines, on the node's stderr
    try:
        store = SqlProjection(url)
    except Exception as e:  # noqa: BLE001 - a bad URL is the caller's error to log, not a silent exit
        _answer_error(conn, e)
        return
    conn.send((True, None))
    # What the child holds now (its imports: ~56,000 objects; more in a fork of a node's zygote) lives as long as it
    # does: out of the collector's sight, a full collection walks only what the writer made since (10 ms -> 0 for the
    # imports alone). Collections were ~15% of a writer's samples under 64 writers (perf), and none after.
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        while True:
            try:
                msg = conn.recv()
            except EOFError:
                return   # the node went away
            if msg is None:
                return
            name, args = msg
            try:
                if name == "gc_state":
                    value = (gc.get_freeze_count(), gc.get_threshold())
                elif name in CALLS:
                    value = getattr(store, name)(*args)
                else:
                    raise ValueError(f"unknown call {name!r}")
            except Exception as e:  # noqa: BLE001 - every failure is the caller's to see
                _answer_error(conn, e)
            else:
                conn.send((True, value))
    finally:
        store.close()


def main() -> None:
    writer_zygote.name_this_process(writer_zygote.WRITER_NAME)
    serve(Connection(int(sys.argv[1])))


if __name__ == "__main__":
    main()
