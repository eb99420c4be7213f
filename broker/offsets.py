"""Consumer offsets kept beside the data: one small append-only file per broker, replayed into a dict on start.

Each commit is one JSON line, flushed and fsynced before it is acknowledged; the file is rewritten compactly when it
grows past a bound, so its size stays proportional to the number of (group, topic, queue) keys.
"""

from __future__ import annotations

import json
import os

COMPACT_AFTER_LINES = 100_000
KEYS_MAX = 1_000_000


class OffsetStore:
    def __init__(self, path: str):
        self.path = path
        self._offsets: dict[tuple[str, str, int], int] = {}
        self._lines = 0
        if os.path.exists(path):
            with open(path, "rb") as f:
                for line in f:
                    try:
                        g, t, q, o = json.loads(line)
                    except (ValueError, TypeError):
                        continue  # a torn last line after a crash: its commit was never acknowledged
                    self._offsets[(g, t, q)] = o
                    self._lines += 1
        self._file = open(path, "ab")

    def get(self, group: str, topic: str, queue: int) -> int | None:
        return self._offsets.get((group, topic, queue))

    def commit(self, group: str, topic: str, queue: int, offset: int) -> None:
        key = (group, topic, queue)
        if key not in self._offsets and len(self._offsets) >= KEYS_MAX:
            raise OverflowError(f"at most {KEYS_MAX} committed offsets per broker")
        self._file.write(json.dumps([group, topic, queue, offset]).encode() + b"\n")
        self._file.flush()
        os.fsync(self._file.fileno())
        self._offsets[key] = offset
        self._lines += 1
        if self._lines > COMPACT_AFTER_LINES and self._lines > 2 * len(self._offsets):
            self._compact()

    def _compact(self) -> None:
        tmp = self.path + ".tmp"
        with open(tmp, "wb") as f:
            for (g, t, q), o in self._offsets.items():
                f.write(json.dumps([g, t, q, o]).encode() + b"\n")
            f.flush()
            os.fsync(f.fileno())
        self._file.close()
        os.replace(tmp, self.path)
        self._file = open(self.path, "ab")
        self._lines = len(self._offsets)

    def close(self) -> None:
        self._file.close()
