"""Pure placement decisions: which broker hosts which logic queue, which slots map to which queue.

Deterministic by construction (sorted inputs, ties broken by name) because the state machine calls it inside apply.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping

from wire import names

from .limits import SLOTS_PER_TOPIC_MAX

# The physical queue names meta hands out; brokers parse them too (a recovered frame names no topic): one rule, in
# wire/names.py
physical_queue_name = names.physical_queue_name
parse_physical_queue_name = names.parse_physical_queue_name

# Every number of a slot table (slot bounds, queue ids: queues <= slots) as one shared object, so that a packed
# table costs a pointer per number, not an int object each.
_SHARED_INTS = tuple(range(SLOTS_PER_TOPIC_MAX + 1))


def balanced_assignment(queues: Iterable[int], brokers: Iterable[str], load: Mapping[str, int]) -> dict[int, str]:
    """Assign each queue to the broker with the least load so far (existing load counted), ties by name."""
    heap = [(load.get(b, 0), b) for b in sorted(set(brokers))]
    heapq.heapify(heap)
    out: dict[int, str] = {}
    for q in sorted(queues):
        n, b = heapq.heappop(heap)
        out[q] = b
        heapq.heappush(heap, (n + 1, b))
    return out


def followers(leader: str, count: int, brokers: Iterable[str], zones: Mapping[str, str | None]) -> list[str]:
    """``count`` brokers other than ``leader`` to hold copies of its queue: the brokers after it in name order (so
    the copies of queues led by different brokers spread over different brokers, as Kafka's replica assignment
    shifts by partition), taking first those in a zone not used yet, leader's included (RocketMQ and Kafka's
    rack awareness: one zone lost loses no queue)."""
    ring = sorted(set(brokers) - {leader})
    ring = [b for b in ring if b > leader] + [b for b in ring if b < leader]
    chosen: list[str] = []
    used = {zones.get(leader)}
    for b in ring:   # first pass: a new zone each (brokers that name no zone count as one zone of their own each)
        z = zones.get(b)
        if len(chosen) < count and (z is None or z not in used):
            chosen.append(b)
            used.add(z)
    for b in ring:
        if len(chosen) < count and b not in chosen:
            chosen.append(b)
    return chosen


def rebalance(current: Mapping[int, str], targets: Iterable[str]) -> dict[int, str]:
    """Spread the given queues over the target brokers with as few moves as possible.

    A queue stays where it is when its broker is a target with room under the fair share; the others go to the
    least-loaded targets. Returns only the queues that move: {queue: new broker}.
    """
    targets = sorted(set(targets))
    base, extra = divmod(len(current), len(targets))
    # Balanced means every target ends with `base` or `base + 1` queues, `extra` of them with the larger count.
    # Those already holding the most keep the larger caps, so the fewest queues move.
    held = {b: 0 for b in targets}
    for b in current.values():
        if b in held:
            held[b] += 1
    by_held = sorted(targets, key=lambda b: (-held[b], b))
    cap = {b: base + (1 if i < extra else 0) for i, b in enumerate(by_held)}
    kept: dict[str, int] = {b: 0 for b in targets}
    moving: list[int] = []
    for q in sorted(current):
        b = current[q]
        if b in kept and kept[b] < cap[b]:
            kept[b] += 1
        else:
            moving.append(q)
    return balanced_assignment(moving, targets, kept)


def initial_slot_table(slots: int, queues: int) -> list[list[int]]:
    """Queue i gets slots [i*slots//queues, (i+1)*slots//queues): every slot exactly once, sizes differ by at most 1."""
    return [[i * slots // queues, (i + 1) * slots // queues, i] for i in range(queues)]


def packed_slot_table(table: Iterable[Iterable[int]]) -> tuple[int, ...]:
    """A table as the image keeps it: one flat tuple ``(lo, hi, queue, lo, hi, queue, ...)`` of shared ints (a
    list per range costs about 160 B per queue; this, 24)."""
    return tuple(_SHARED_INTS[v] for r in table for v in r)


def slot_table(packed: tuple[int, ...]) -> list[list[int]]:
    """A packed table as the API shows it: ``[[lo, hi, queue], ...]`` (new lists: the caller may keep them)."""
    return [list(packed[i:i + 3]) for i in range(0, len(packed), 3)]


def grow_slot_table(table: list[list[int]], new_queue_ids: Iterable[int]) -> tuple[list[list[int]], list[tuple[int, int]]]:
    """Give each new queue the upper half of the currently largest range (ties: lowest queue id, then lowest lo).

    Returns the new table (sorted by lo) and the (new queue, split queue) pairs, which become barriers.
    Ranges of one slot cannot split; the caller guarantees queues <= slots so a splittable range always exists.
    """
    # Each range carries the queue that owned its slots before this growth: a range split off a queue created in
    # this same growth still inherits from the old owner, and the barrier must name that one.
    ranges = [[lo, hi, q, q] for lo, hi, q in table]
    splits: list[tuple[int, int]] = []
    for nq in sorted(new_queue_ids):
        victim = max(ranges, key=lambda r: (r[1] - r[0], -r[2], -r[0]))
        lo, hi, _q, origin = victim
        if hi - lo < 2:
            raise ValueError("no slot range left to split")
        mid = lo + (hi - lo) // 2
        victim[1] = mid
        ranges.append([mid, hi, nq, origin])
        splits.append((nq, origin))
    ranges.sort(key=lambda r: r[0])
    return [[lo, hi, q] for lo, hi, q, _ in ranges], splits
