"""Which segments' commits this disk holds all of: one ``[topic, queue, physical queue]`` checked line each, in
witnessed.log.

A read of a committed offset asks the holders of each older segment of the queue (broker/reads.py
``read_committed``), and a holder answers from its own store. A store holds every acknowledged commit of a segment
only if this disk was the segment's leader or one of its in-sync copies: the leader acknowledges a commit once every
in-sync copy holds it, and a copy joins the in-sync set only after it stored the leader's snapshot of the queue's
commits (broker/replication/offsets.py). A broker back on a new disk is still named by the segments it held (their
leader, sealer or in-sync copies) but holds none of their commits, and its "nothing" must not settle a segment:
the chaos runner (seed 7) read -1 for a group whose commit sat only on a copy that was down, after two holders back
on empty disks had answered.

A mark is made when a route this broker follows since it registered (its version at least the registration's:
``MetaSession.routes_needed``) names it the leader or an in-sync copy of a queue's head. A physical queue's name
carries its topic's incarnation and gen, so a topic deleted and made again is never taken for the old one. Marks are
written without an fsync: one lost in a power loss makes this broker's answer count for less (the reader waits for
another holder), never for more. At MARKS_MAX no mark is added (its answers count for less, as after a loss).
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import structlog

from .storage import files, lines
from .storage.errors import CorruptFile

log = structlog.get_logger("broker.offsets")

FILE = "witnessed.log"
MARKS_MAX = 1_000_000   # physical queues; a name is at most ~200 bytes


Mark = tuple[str, int, str]   # topic, queue, physical queue


class WitnessLog:
    def __init__(self, path: str):
        self.path = os.path.abspath(path)
        loaded = lines.read(self.path)
        self._marks: dict[tuple[str, int], set[str]] = {}
        self._count = 0
        for value in loaded.values:
            if not (isinstance(value, list) and len(value) == 3 and isinstance(value[0], str)
                    and isinstance(value[1], int) and isinstance(value[2], str)):
                raise CorruptFile(f"{self.path}: a line that passed its check is not [topic, queue, physical queue]: "
                                  f"{str(value)[:200]}", path=self.path)
            self._add(value[0], value[1], value[2])
        self._fd = files.open_lines(self.path, loaded.whole)
        self._full_logged = False

    def held(self, topic: str, queue: int) -> frozenset[str]:
        """The segments of ``topic``/``queue`` (physical queues) whose every acknowledged commit this disk holds."""
        return frozenset(self._marks.get((topic, queue), ()))

    def mark(self, marks: Iterable[Mark]) -> None:
        new = sorted({m for m in marks if m[2] not in self._marks.get((m[0], m[1]), ())})
        if not new or self._fd < 0:
            return
        room = MARKS_MAX - self._count
        if len(new) > room:
            if not self._full_logged:
                log.warning("offset_witness_full", marks_max=MARKS_MAX, path=self.path)
                self._full_logged = True
            new = new[:max(room, 0)]
        try:
            files.write_all(self._fd, b"".join(lines.encode(list(m)) for m in new))
        except OSError:
            log.exception("offset_witness_write_failed", path=self.path)
            self.close()   # what reached the file is unknown: nothing more is appended to it
            return         # not marked: its answers count for less
        for m in new:
            self._add(*m)

    def _add(self, topic: str, queue: int, physical_queue: str) -> None:
        held = self._marks.setdefault((topic, queue), set())
        if physical_queue not in held:
            held.add(physical_queue)
            self._count += 1

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
