"""The pop state this broker holds as a copy of queues other brokers lead (issue 37; the leader's side is
broker/replication/pop_copies.py): kept apart from the broker's own pop state, never popped from, and taken over
only when a failover makes this broker the queue's head (service.py ``_state_for``).

The file ``pop/replica.log`` holds checked lines (storage/lines.py) of two kinds, applied in order:
- ``["L", line]``: a pop journal line of the leader (state.py ``take_line`` / ``full_line``), applied as the
  broker's own journal applies it (``replay_line``); a line of a newer gen than the key's state held replaces it
  (a leader's first line of a key under its gen is whole), one of an older gen is dropped;
- ``["R", topic, queue, gen]``: the states of that queue under the pushing leader's ``gen`` (or a newer one) are
  dropped: a snapshot follows, which replaces what was held (a delta line only adds and removes, so a stale delivery
  would otherwise outlive the snapshot, here and on replay). A state of an older gen stays: it is a copy of an older
  head's state that this leader has not taken over yet (its snapshot holds nothing of that key), maybe the last one,
  and the leader's first line of the key under its gen replaces it. Dropped with the rest, it was gone before the
  leader asked for it (the chaos runner, seed 884: b2 held the only copy of gen 10's state, b1's disk lost; b3,
  leading gen 12, sent b2 a snapshot as b2 joined its in-sync set before b3 had taken the group over, b2's copy went
  with it, and b3 then took the group over from gen 9's state: 79 acknowledged pops delivered again).
A push is acknowledged once its lines are fsynced. The file is rewritten as one line per key once it holds many
more lines than keys.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Any

import structlog

from wire.errors import invalid, rejection

from ..storage import files, lines
from ..storage.errors import CorruptFile, UnsupportedFormat
from .limits import COMPACT_AFTER_LINES, POP_QUEUES_MAX
from .state import Key, OlderFormatLine, QueueState, replay_line

log = structlog.get_logger("broker.pop.replica")


def _apply(states: dict[Key, QueueState], entry: Any) -> None:
    """One line of the file (ValueError/TypeError/KeyError for a garbled one)."""
    if entry[0] == "R":
        if len(entry) == 3:
            raise OlderFormatLine("a reset line of Stator 0.1 (no gen: it dropped every state of the queue)")
        _, topic, queue, gen = entry
        if type(gen) is not int:
            # Harmless mutants: the words of this error and of the unknown kind's, entry[1] there (load catches all of
            # ValueError, TypeError, KeyError and IndexError and says it in words of its own; apply writes only R and
            # L).
            raise TypeError("a reset line's gen is not an int")
        for key in [k for k, st in states.items() if k[1] == topic and k[2] == queue and st.gen >= gen]:
            del states[key]
    elif entry[0] == "L":
        line = entry[1]
        held = states.get(tuple(line[:3]))
        if held is not None and type(line[4]) is int and line[4] != held.gen:
            # Harmless mutant: <= (equal gens do not reach here).
            if line[4] < held.gen:
                return    # a deposed leader's line, late: the newer leader's state is what is held
            # A new leader's first line of the key, whole (state.py ``take_line``): it replaces the older leader's
            # state instead of adding to it, or a delivery acked there and not here would outlive it (the chaos
            # runner, seed 13: a copy elected later delivered again an ack the old leader had answered)
            del states[held.key]
        replay_line(states, line)
    else:
        raise ValueError(f"unknown kind {entry[0]!r}")


def load(path: str) -> tuple[dict[Key, QueueState], int]:
    """The states the file holds and the length of its good lines (-1: no file); damage raises CorruptFile."""
    states: dict[Key, QueueState] = {}
    loaded = lines.read(path)
    for number, value in enumerate(loaded.values, 1):
        try:
            _apply(states, value)
        except OlderFormatLine as e:
            raise UnsupportedFormat(f"{path}: good line {number}: {e}", path=path) from None
        except (ValueError, TypeError, KeyError, IndexError):
            raise CorruptFile(f"{path}: good line {number} that passed its check is not a replica pop line: "
                              f"{str(value)[:200]}", path=path) from None
    return states, loaded.whole


class ReplicaPopStore:
    def __init__(self, path: str):
        self.path = os.path.abspath(path)
        self.states, whole = load(self.path)
        self._fd = files.open_lines(self.path, whole)
        self._lines = len(self.states)
        self._lock = asyncio.Lock()
        # Harmless mutant: None for False (only tested for truth).
        self._failed = False

    async def apply(self, topic: str, queue: int, leader_gen: int, reset: bool, pushed: list[Any],
                    still_a_copy: Callable[[], None] = lambda: None) -> None:
        """Apply the lines of the leader of gen ``leader_gen`` for one queue (``reset``: a snapshot, replacing what is
        held of the queue under that gen) and
        return once they are durable; 400 for lines that are not pop journal lines of that queue (nothing is
        applied), 409 TOO_MANY_POP_QUEUES past the bound, 503 STORAGE_UNAVAILABLE when the file failed.
        ``still_a_copy`` raises when the pusher no longer leads the queue here: called under the lock, right before
        the lines are applied, since a failover can make this broker the head (and take the state: ``take``) while
        the push waits for the lock; applied after that, an ack would land in a state nobody takes again, and the
        deposed leader would answer it ok (the chaos runner, seed 49)."""
        entries: list[Any] = [["R", topic, queue, leader_gen]] if reset else []
        entries += [["L", line] for line in pushed]
        trial: dict[Key, QueueState] = {}
        for entry in entries[1:] if reset else entries:
            try:
                st = replay_line(trial, entry[1])
            except (ValueError, TypeError, KeyError):
                raise invalid("a pushed line is not a pop journal line") from None
            if st.key[1:] != (topic, queue):
                raise invalid(f"a pushed line names {st.key[1]}/{st.key[2]}, not {topic}/{queue}")
        new_keys = {k for k in trial if k not in self.states}
        if len(self.states) + len(new_keys) > POP_QUEUES_MAX:
            raise rejection(409, "TOO_MANY_POP_QUEUES", f"this broker keeps pop state of at most {POP_QUEUES_MAX} "
                            "(group, topic, queue) as a copy", limit=POP_QUEUES_MAX)
        async with self._lock:
            if self._failed:
                raise rejection(503, "STORAGE_UNAVAILABLE", "the replica pop state file failed; restart the broker")
            still_a_copy()
            for entry in entries:
                _apply(self.states, entry)
            try:
                await asyncio.to_thread(self._write, b"".join(lines.encode(e) for e in entries))
            except OSError:
                log.exception("replica_pop_write_failed", path=self.path)
                self._failed = True
                raise rejection(503, "STORAGE_UNAVAILABLE", "the replica pop state file failed") from None
            self._lines += len(entries)
            if self._lines > COMPACT_AFTER_LINES and self._lines > 2 * len(self.states):
                await self._compact()

    def take(self, key: Key) -> QueueState | None:
        """The copy's state of ``key``, handed to the broker's own pop state (a failover made it the head); what the
        file still holds of it is dropped at the next compaction, and loses to the newer gen if read back before."""
        return self.states.pop(key, None)

    def _write(self, data: bytes) -> None:
        files.write_all(self._fd, data)
        files.sync_data(self._fd)

    async def _compact(self) -> None:
        body = b"".join(lines.encode(["L", st.full_line()]) for st in self.states.values())
        try:
            await asyncio.to_thread(self._replace, body)
        except OSError:
            log.exception("replica_pop_compaction_failed", path=self.path)
            self._failed = True
            return
        self._lines = len(self.states)

    def _replace(self, body: bytes) -> None:
        self._fd = files.replace_lines(self.path, body, self._fd)

    def close(self) -> None:
        os.close(self._fd)
