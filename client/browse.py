"""Finding messages in one logic queue without consuming it: its bounds, and one key's messages.

What ``stator consume`` and the console's Messages page both use, over any ``Pull`` (one page of a queue from an
offset): ``PullConsumer.pull`` in the CLI, the node's own call to the head broker in the console. (By time is the
broker's own answer, ``GET /v1/queues/{topic}/{queue}/offset?ts=``: Kafka's ``offsetsForTimes``, from each
segment's time index.)

- **By key** scans forward from an offset and keeps the messages of that key, as AKHQ and Redpanda Console search:
  brokers keep no index of keys. A scan reads at most ``scan_max`` messages (``SCAN_MESSAGES_MAX`` at most) and
  says where it stopped, so that the next one goes on from there. A key's queue is the one its slot maps to now
  (``slots.queue_for_key``); after a topic grew, its older messages may be in the queue it mapped to before.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from wire.params import PULL_MESSAGES_MAX

from .consumer import PullResult, ReceivedMessage

Pull = Callable[[int, int], Awaitable[PullResult]]   # (offset, max messages) -> one page from that offset on

SCAN_MESSAGES_MAX = 100_000     # one key search reads at most this many messages
SCAN_MESSAGES_DEFAULT = 10_000
FOUND_MAX = 1_000               # messages one key search returns (it stops once it has them)


@dataclass(frozen=True)
class Bounds:
    min_offset: int     # the oldest offset the queue still has
    max_offset: int     # past the newest readable message


@dataclass(frozen=True)
class KeySearch:
    messages: list[ReceivedMessage]
    next_offset: int    # where the scan stopped: a search from here goes on
    scanned: int        # messages read
    at_end: bool        # the scan reached the queue's readable end


async def bounds(pull: Pull) -> Bounds:
    """The queue's offsets now, from one read of one message at 0 (the head broker serves the whole history)."""
    r = await pull(0, 1)
    lo = r.min_offset if r.min_offset is not None else (r.messages[0].offset if r.messages else r.next_offset)
    hi = r.max_offset if r.max_offset is not None else r.next_offset
    return Bounds(lo, max(lo, hi))


async def find_key(pull: Pull, key: str, offset: int, scan_max: int = SCAN_MESSAGES_DEFAULT,
                   found_max: int = FOUND_MAX) -> KeySearch:
    """The messages of ``key`` from ``offset`` on, in offset order, reading at most ``scan_max`` messages and
    keeping at most ``found_max``."""
    if not 1 <= scan_max <= SCAN_MESSAGES_MAX:
        raise ValueError(f"scan_max must be within [1, {SCAN_MESSAGES_MAX}]")
    if not 1 <= found_max <= FOUND_MAX:
        raise ValueError(f"found_max must be within [1, {FOUND_MAX}]")
    found: list[ReceivedMessage] = []
    scanned = 0
    while scanned < scan_max and len(found) < found_max:
        r = await pull(offset, min(PULL_MESSAGES_MAX, scan_max - scanned))
        for m in r.messages:
            scanned += 1
            offset = m.offset + 1
            if m.key == key:
                found.append(m)
                if len(found) == found_max:
                    return KeySearch(found, offset, scanned, False)
        if not r.messages and r.next_offset <= offset:
            return KeySearch(found, offset, scanned, True)
        offset = max(offset, r.next_offset)   # past a skipped range too
    return KeySearch(found, offset, scanned, False)
