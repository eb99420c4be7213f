"""The pop journal: one append-only file of JSON lines per broker, replayed into the pop state on start.

Each line is the delta of one (group, topic, queue) since its previous line (state.py ``take_line``). One round task
on the event loop takes the lines of every changed key, a thread writes them in one write and covers them with one
fsync (group commit), and then every ack or change that waited for that round is answered; pops never wait (their
first deliveries are written lazily, see state.py). The file is rewritten compactly (one line per key with its
written deliveries) once it holds many more lines than keys. Lines are checked (storage/lines.py: CRC-32, format
version): a torn tail, never acknowledged, is cut back on start; a damaged line refuses the start.

Refusals, as coded ApiErrors: 503 TOO_MANY_WAITERS when JOURNAL_WAITERS_MAX already wait; 503 STORAGE_UNAVAILABLE
when a write or fsync failed (nothing after can be trusted until a restart replays the file), or no round confirmed
within JOURNAL_WAIT_S.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import structlog

from wire.errors import ApiError, rejection
from wire.waits import wait_set

from ..replication.leader import QueueRef, unconfirmed
from ..storage import files, lines
from ..storage.errors import CorruptFile, UnsupportedFormat
from .limits import COMPACT_AFTER_LINES, FLUSH_TICK_MS, JOURNAL_WAIT_S, JOURNAL_WAITERS_MAX
from .state import Key, OlderFormatLine, QueueState, replay_line

if TYPE_CHECKING:
    from ..replication.pop_copies import PopCopies

log = structlog.get_logger("broker.pop.journal")
IDLE_WAKE_S = 1.0


def unavailable() -> ApiError:
    return rejection(503, "STORAGE_UNAVAILABLE", "the broker could not store the pop state: its journal failed or "
                     "is closed, or the disk did not confirm in time")


def load(path: str) -> tuple[dict[Key, QueueState], int]:
    """The states the file holds and the length of its good lines (-1: no file). What follows them is a torn
    write's remains, never acknowledged; damage (not a tear) raises CorruptFile (storage/lines.py)."""
    states: dict[Key, QueueState] = {}
    loaded = lines.read(path)
    for number, value in enumerate(loaded.values, 1):
        try:
            replay_line(states, value)
        except OlderFormatLine as e:
            raise UnsupportedFormat(f"{path}: good line {number}: {e}", path=path) from None
        except (ValueError, TypeError, KeyError):
            raise CorruptFile(f"{path}: good line {number} that passed its check is not a pop journal line: "
                              f"{str(value)[:200]}", path=path) from None
    return states, loaded.whole


class Journal:
    def __init__(self, path: str, states: dict[Key, QueueState], whole: int,
                 now_ms: Callable[[], int] = lambda: int(time.time() * 1000)):
        self.path = os.path.abspath(path)
        self.states = states
        self._now_ms = now_ms
        self._fd = files.open_lines(self.path, whole)
        self._lines = len(states)
        self._changed: set[Key] = set()
        self._waiters: list[tuple[asyncio.Future, frozenset[tuple[str, int]]]] = []   # (answer, confirm)
        self._wake = asyncio.Event()
        # Harmless mutants: None for False in _failed and _closed (only ever tested for truth).
        self._failed = False
        self._closed = False
        self._task: asyncio.Task | None = None
        # The copies of the queues this broker leads (broker/replication/pop_copies.py): each round's lines go to them
        self.copies: PopCopies | None = None
        self.lines_written = 0

    def start(self) -> None:
        # Harmless mutants: the task's name (nothing looks a task up by name).
        self._task = asyncio.create_task(self._run(), name="pop-journal")

    def touch(self, key: Key) -> None:
        """``key``'s state changed; the next round looks at it."""
        if not self._changed:
            self._wake.set()          # the round task idles while nothing changed: start ticking again
        self._changed.add(key)

    def kick(self) -> None:
        self._wake.set()

    async def durable(self, confirm: Iterable[tuple[str, int]] = ()) -> None:
        """Returns once a round that started after this call has been written and fsynced. ``confirm``: the
        (topic, queue)s whose lines must also be on their copies: REPLICATION_UNCONFIRMED when that round found
        one's head moved away from here, its lines then on this disk alone (the chaos runner, seed 63: acks b1
        answered ok just after a remap moved the queue on, stored on b1 only; b1 lost its disk before any head took
        them over, and b2 delivered them again from its copy). The caller touches those keys and calls this with
        no await between, so that their lines and this wait fall in one round."""
        if self._failed or self._closed:
            raise unavailable()
        if len(self._waiters) >= JOURNAL_WAITERS_MAX:
            raise rejection(503, "TOO_MANY_WAITERS", "too many pop acks wait for the disk; retry shortly",
                            limit=JOURNAL_WAITERS_MAX)
        future = asyncio.get_running_loop().create_future()
        self._waiters.append((future, frozenset(confirm)))
        self._wake.set()
        try:
            await asyncio.wait_for(asyncio.shield(future), JOURNAL_WAIT_S)
        except asyncio.TimeoutError:
            raise unavailable() from None
        finally:
            if not future.done():
                # Its waiter is gone (timed out, or its request cancelled): the round's answer goes nowhere, and
                # an error left unretrieved would be logged as "Future exception was never retrieved"
                future.add_done_callback(lambda f: f.cancelled() or f.exception())

    async def _run(self) -> None:
        while True:
            # Tick while first deliveries mature; idle otherwise (bounded, so a lost wake-up costs a second).
            # Harmless mutant: / 1001 (a tick of 19.98 ms for 20).
            await wait_set(self._wake, FLUSH_TICK_MS / 1000 if self._changed else IDLE_WAKE_S)
            self._wake.clear()
            try:
                await self.round()
            except Exception:
                log.exception("pop_journal_round_failed")
                self._failed = True

    async def round(self, force: bool = False) -> None:
        """One group commit: every changed key's line, one write, one fsync, and the same lines on the copies of the
        queues this broker leads (``copies``, broker/replication/pop_copies.py), then the waiters are answered."""
        waiters, self._waiters = self._waiters, []
        try:
            await self._round(waiters, force)
        except BaseException:
            # A bug (not a disk error) or a cancel mid-round: the waits this round took learn it now, not after
            # JOURNAL_WAIT_S; what the round wrote, if anything, is unknown to them
            for f, _ in waiters:
                if not f.done():
                    f.set_exception(unavailable())
            raise

    async def _round(self, waiters: list[tuple[asyncio.Future, frozenset[tuple[str, int]]]], force: bool) -> None:
        now = self._now_ms()
        values: list[list] = []
        still: set[Key] = set()
        for key in self._changed:
            st = self.states.get(key)
            if st is None:
                continue
            line = st.take_line(now, force)
            if line is not None:
                values.append(line)
            if st.fresh:
                still.add(key)        # first deliveries still maturing: look again next round
        self._changed = still    # keys touched while this round writes join the next one
        # Harmless mutants: None for pushes' empty start (without copies it is only tested for truth; with them
        # collect replaces it), None for collect's now (it reaches only take_line(force=True), which never reads it).
        pushes: list = []
        stranded: set[tuple[str, int]] = set()
        if self.copies is not None and not self._failed:
            extra, pushes, stranded = self.copies.collect(self.states, values, now)
            values += extra
        out = [lines.encode(v) for v in values]
        wrote, pushed = await asyncio.gather(self._write_round(out), self._push_round(pushes), return_exceptions=True)
        if isinstance(wrote, OSError):
            log.error("pop_journal_write_failed", path=self.path, error=str(wrote))
            self._failed = True
        elif isinstance(wrote, BaseException):
            raise wrote
        if isinstance(pushed, BaseException) and not isinstance(pushed, ApiError):
            raise pushed
        # Harmless mutant: an always-true test of pushed (pushed is None or an ApiError here: any other exception was
        # raised above, so error is pushed either way).
        error = unavailable() if self._failed else pushed if isinstance(pushed, ApiError) else None
        for f, confirm in waiters:
            # Harmless mutant: break for continue (never done here: durable shields its future, and nothing else
            # answers it; each waiter is in one round only).
            if f.done():
                continue
            moved = sorted(confirm & stranded) if error is None else ()
            if moved:
                f.set_exception(unconfirmed(QueueRef(*moved[0]), "the queue's head moved away from this broker "
                                            "before its copies stored the pop state", "the pop state is"))
            else:
                f.set_exception(error) if error is not None else f.set_result(None)
        if not self._failed and self._lines > COMPACT_AFTER_LINES and self._lines > 2 * len(self.states):
            await self._compact()

    async def _write_round(self, out: list[bytes]) -> None:
        if out and not self._failed:
            await asyncio.to_thread(self._write, b"".join(out))
            self._lines += len(out)
            self.lines_written += len(out)

    async def _push_round(self, pushes: list) -> None:
        if pushes:
            await self.copies.push(pushes)

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view):]
        files.sync_data(self._fd)

    async def _compact(self) -> None:
        """Rewrite the file as one line per key. Runs between rounds, so what it writes is what is durable."""
        # Harmless mutants: None for now, or for take_line's now (force=True never reads it).
        now = self._now_ms()
        for st in self.states.values():   # bring every key up to date first: the new file replaces every line
            st.take_line(now, force=True)
        body = b"".join(lines.encode(st.full_line()) for st in self.states.values())
        if self.copies is not None:
            # What was just brought up to date went into the new file only: the copies get each queue whole at the
            # next round, or a later line would move their pop offset past deliveries they never got
            self.copies.resync()
        try:
            await asyncio.to_thread(self._replace, body)
        except OSError:
            log.exception("pop_journal_compaction_failed", path=self.path)
            self._failed = True
            return
        self._lines = len(self.states)

    def _replace(self, body: bytes) -> None:
        self._fd = files.replace_lines(self.path, body, self._fd)

    async def close(self) -> None:
        """Stops the round task and writes everything still in memory (first deliveries included)."""
        if self._task is not None:
            self._task.cancel()
            # Harmless mutant: the task left out of the gather (cancelled while suspended, it ends at the first await
            # of the round below and touches no state after its cancel either way).
            await asyncio.gather(self._task, return_exceptions=True)
        if not self._closed:
            # Not to the copies: one unreachable would hold the stop for REPLICATION_WAIT_S, and what this round
            # writes (first deliveries not written yet) they may lack, as after a crash: the pop offset they hold
            # never passed those deliveries
            self.copies = None
            # Harmless mutant: = for |= (a changed key without a state is skipped by the round anyway).
            self._changed |= set(self.states)
            await self.round(force=True)
            self._closed = True
            os.close(self._fd)
