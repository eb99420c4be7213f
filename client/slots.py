"""Keys to slots to logic queues (API.md, Keys): ``slot = zlib.crc32(key as UTF-8) mod slots``, and a slot table of
``[lo, hi, queue]`` ranges that covers every slot ``[0, slots)`` exactly once.

The CRC is the standard CRC-32 (IEEE 802.3, the one of zlib, gzip and PNG; ``crc32("123456789") == 0xCBF43926``),
so a client in any language maps a key to the same slot.
"""

from __future__ import annotations

import bisect
import zlib
from collections.abc import Sequence


def slot_of(key: str | bytes, slots: int) -> int:
    """The key's slot. A ``str`` key is encoded as UTF-8; ``bytes`` are taken as they are."""
    if slots <= 0:
        raise ValueError("slots must be positive")
    # Harmless mutant: "UTF-8" for "utf-8" (codec names are case-insensitive).
    data = key.encode("utf-8") if isinstance(key, str) else bytes(key)
    return zlib.crc32(data) % slots


class SlotTable:
    """A checked slot table with O(log n) lookup. Build once per route version, look up per message."""

    __slots__ = ("ranges", "slots", "_los")

    def __init__(self, ranges: Sequence[Sequence[int]], slots: int | None = None):
        table = sorted((int(lo), int(hi), int(q)) for lo, hi, q in ranges)
        if not table:
            raise ValueError("empty slot table")
        expected_lo = 0
        for lo, hi, q in table:
            if lo != expected_lo:
                raise ValueError(f"slot table has a gap or an overlap at slot {min(lo, expected_lo)}")
            if hi <= lo:
                raise ValueError(f"slot table has an empty range [{lo}, {hi})")
            if q < 0:
                raise ValueError(f"slot table maps [{lo}, {hi}) to a negative queue {q}")
            expected_lo = hi
        if slots is not None and expected_lo != slots:
            raise ValueError(f"slot table covers [0, {expected_lo}), not [0, {slots})")
        self.ranges = table
        self.slots = expected_lo
        self._los = [lo for lo, _, _ in table]

    def queue_of(self, slot: int) -> int:
        if not 0 <= slot < self.slots:
            raise ValueError(f"slot {slot} is outside [0, {self.slots})")
        return self.ranges[bisect.bisect_right(self._los, slot) - 1][2]

    def queue_of_key(self, key: str | bytes) -> int:
        return self.queue_of(slot_of(key, self.slots))


def queue_for_slot(slot_table: Sequence[Sequence[int]] | SlotTable, slot: int) -> int:
    """The logic queue that owns ``slot``. Pass a ``SlotTable`` to avoid re-checking the table on every call."""
    table = slot_table if isinstance(slot_table, SlotTable) else SlotTable(slot_table)
    return table.queue_of(slot)


def queue_for_key(route: dict, key: str | bytes) -> int:
    """The logic queue of ``key`` in a route (``slots`` and ``slot_table`` fields)."""
    table = SlotTable(route["slot_table"], route["slots"])
    return table.queue_of(slot_of(key, route["slots"]))
