"""Idempotent sends: a batch resent by its producer is stored once (Kafka's idempotent producer).

A producer names itself (``X-Producer-Id``, a number it drew at random) and numbers its batches per logic queue
(``X-Producer-Seq``). Each broker keeps, per logic queue, the last BATCHES_PER_PRODUCER batches of each producer with
the logic offsets they were stored at: the leader as it appends, a follower as it copies (the leader's fetch answer
names the batches of the records it carries: replication/frames.py). A batch seen again is answered with the offsets
it was stored at and not appended again; so a producer that resends after a failover, to the new leader, gets the
offsets the old leader gave, as long as the batch reached the copy that was elected. A remap's new head, which may
hold nothing of the old one, takes the old segment's batches from its holders (replication/producer_handover.py).

Entries are kept in logic offsets with the gen that stored them. When a gen is sealed, entries of that gen past its
end are dropped (``sealed``): a copy may hold records past the end the elected replica reported, never kept.
A deleted topic's entries stay until the least recently used are evicted (QUEUES_MAX): producers draw their ids
at random (63 bits), so a topic created again under the name never meets them. Every batch recorded is also written
to the broker's producers.log (producer_journal.py), durable before its send is answered, and loaded again at start:
a broker that restarts or loses power answers a resend of a batch it acknowledged as it did before. Held in memory
only, the table was lost with a power loss of every copy, and the resend was stored a second time.
"""

from __future__ import annotations

import bisect
from collections import Counter, OrderedDict, deque
from collections.abc import Iterator
from typing import NamedTuple

BATCHES_PER_PRODUCER = 8        # a producer's batches remembered per logic queue (Kafka: 5 in flight)
PRODUCERS_PER_QUEUE_MAX = 1_000  # the least recently seen producer of a queue is forgotten past this
QUEUES_MAX = 200_000             # logic queues with a table; the least recently used is forgotten past this
PRODUCER_ID_MAX = 2**63 - 1
SEQ_MAX = 2**63 - 1


class Batch(NamedTuple):
    producer: int
    seq: int
    first: int     # logic offset of its first record
    count: int
    gen: int
    pq: str = ""        # the physical queue holding its records here, and the physical offset of its first record:
    physical: int = -1  # what a restart checks the batch against (producer_journal.py)


class ProducerTable:
    def __init__(self) -> None:
        # (topic, queue) -> producer -> its last batches, oldest first
        self._queues: OrderedDict[tuple[str, int], OrderedDict[int, deque[Batch]]] = OrderedDict()
        self._topics: Counter[str] = Counter()   # topic -> its queues with a table (``holds`` on every route change)

    def find(self, topic: str, queue: int, producer: int, seq: int, count: int) -> Batch | None:
        """The batch (producer, seq) if this broker stored or copied it, with as many records."""
        batches = self._queues.get((topic, queue), {}).get(producer)
        if not batches:
            return None
        for b in batches:
            if b.seq == seq and b.count == count:
                return b
        return None

    def record(self, topic: str, queue: int, batch: Batch) -> bool:
        """Remember ``batch``; False when the queue holds a batch at its offset already (nothing new)."""
        key = (topic, queue)
        producers = self._queues.get(key)
        if producers is None:
            producers = self._queues[key] = OrderedDict()
            self._topics[topic] += 1
            if len(self._queues) > QUEUES_MAX:
                (old_topic, _), _ = self._queues.popitem(last=False)
                self._topics[old_topic] -= 1
                if not self._topics[old_topic]:
                    del self._topics[old_topic]
        else:
            self._queues.move_to_end(key)
        batches = producers.get(batch.producer)
        if batches is None:
            batches = producers[batch.producer] = deque(maxlen=BATCHES_PER_PRODUCER)
            if len(producers) > PRODUCERS_PER_QUEUE_MAX:
                producers.popitem(last=False)
        else:
            producers.move_to_end(batch.producer)
        if any(b.first == batch.first for b in batches):
            return False
        if not batches or batch.first > batches[-1].first:
            batches.append(batch)   # the leader's and a copy's way: each batch after the last
            return True
        # A batch of an older segment, handed over after this head stored newer ones (replication/producer_handover.py):
        # kept in offset order, so that the oldest is the one forgotten
        if len(batches) == batches.maxlen:
            if batch.first < batches[0].first:
                return False
            batches.popleft()
        batches.insert(bisect.bisect([b.first for b in batches], batch.first), batch)
        return True

    def batches(self, topic: str, queue: int) -> list[Batch]:
        """Every batch remembered of a queue."""
        return [b for batches in self._queues.get((topic, queue), {}).values() for b in batches]

    def sealed(self, topic: str, queue: int, gen: int, logic_end: int) -> None:
        """Gen ``gen`` of the queue ended at ``logic_end``: its batches past the end were never kept."""
        for batches in self._queues.get((topic, queue), {}).values():
            kept = [b for b in batches if b.gen != gen or b.first + b.count <= logic_end]
            if len(kept) != len(batches):
                batches.clear()
                batches.extend(kept)

    def covering(self, topic: str, queue: int, gen: int, first: int, end: int) -> list[Batch]:
        """The batches of gen ``gen`` stored in [first, end) logic offsets: what a fetch of those records names."""
        out = [b for batches in self._queues.get((topic, queue), {}).values() for b in batches
               if b.gen == gen and first <= b.first < end]
        out.sort(key=lambda b: b.first)
        return out

    def entries(self) -> Iterator[tuple[str, int, Batch]]:
        """Every batch remembered, as (topic, queue, batch), a queue's oldest first per producer."""
        for (topic, queue), producers in self._queues.items():
            for batches in producers.values():
                for b in batches:
                    yield topic, queue, b

    def holds(self, topic: str) -> bool:
        return topic in self._topics
