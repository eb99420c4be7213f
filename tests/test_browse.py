"""client/browse.py over a queue in memory: its bounds, and by key every message of the key, across a skipped range,
bounded, and resumable where it stopped. (The real cluster runs them too: tests/test_admin_cli.py's produce and
consume, tests/test_console.py's Messages page.)"""

from __future__ import annotations

import pytest

from client import browse
from client.consumer import PullResult, ReceivedMessage


class Queue:
    """Offsets [start, end) minus ``skipped``, each message's ts and key given; answers pulls as a head broker does
    (from an offset inside a skipped range, the next message after it)."""

    def __init__(self, stamps: dict[int, tuple[int, str]], start: int, end: int):
        self.stamps, self.start, self.end = stamps, start, end
        self.reads = 0

    async def pull(self, offset: int, n: int) -> PullResult:
        self.reads += 1
        got = [ReceivedMessage("t", 0, o, b"", key, {}, ts) for o in range(max(offset, self.start), self.end)
               if o in self.stamps for ts, key in [self.stamps[o]]][:n]
        nxt = got[-1].offset + 1 if got else max(offset, self.end if offset >= self.start else self.start)
        return PullResult(0, got, nxt, self.start, self.end)


def _queue() -> Queue:
    # offsets 5..99 kept (0..4 deleted by retention), 40..59 skipped (a budget jumped); ts 1000 + offset // 2
    stamps = {o: (1000 + o // 2, "k" if o % 10 == 3 else f"o{o}") for o in range(5, 100) if not 40 <= o < 60}
    return Queue(stamps, 5, 100)


async def test_an_empty_queue_has_nothing_to_find():
    assert await browse.bounds(Queue({}, 7, 7).pull) == browse.Bounds(7, 7)
    found = await browse.find_key(Queue({}, 7, 7).pull, "k", 7)
    assert (found.messages, found.at_end, found.scanned) == ([], True, 0)


async def test_a_key_s_messages_in_order_bounded_and_resumable():
    q = _queue()
    whole = await browse.find_key(q.pull, "k", 0)
    expect = [o for o in range(5, 100) if o % 10 == 3 and not 40 <= o < 60]
    assert [m.offset for m in whole.messages] == expect and whole.at_end and whole.scanned == 75
    part = await browse.find_key(q.pull, "k", 0, scan_max=20)
    assert [m.offset for m in part.messages] == [13, 23] and not part.at_end and part.scanned == 20
    rest = await browse.find_key(q.pull, "k", part.next_offset)
    assert [m.offset for m in part.messages + rest.messages] == expect
    first_two = await browse.find_key(q.pull, "k", 0, found_max=2)
    assert [m.offset for m in first_two.messages] == [13, 23] and first_two.next_offset == 24
    with pytest.raises(ValueError):
        await browse.find_key(q.pull, "k", 0, scan_max=browse.SCAN_MESSAGES_MAX + 1)
