"""Idempotent sends: a batch resent by its producer is stored once (Kafka's idempotent producer).

A producer names itself (``X-Producer-Id``, a number it drew at random) and numbers its batches per logic queue
(``X-Producer-Seq``). Each broker keeps, per logic queue, the last BATCHES_PER_PRODUCER batches of each producer with
the logic offsets they were stored at: the leader as it appends, a follower as it copies (the leader's fetch answer
names the batches of the records it carries: replication/frames.py). A batch seen again is answered with the offsets
it was stored at and not appended again; so a producer that resends after a failover, to the new leader, gets the
offsets the old leader gave, as long as the batch reached the copy that was elected.

Entries are kept in logic offsets with the gen that stored them. When a gen is sealed, entries of that gen past its
end are dropped (``sealed``): a copy may hold records past the end the elected replica reported, never kept.
A deleted topic's entries stay until the least recently used are evicted (QUEUES_MAX): producers draw their ids
at random (63 bits), so a topic created again under the name never meets them. The table lives in memory: a broker
that restarts loses its copies' standing anyway (it is not in sync until it has caught up, and it learns the batches
again as it does); a queue of one copy loses it with the restart.
"""

from __future__ import annotations

from collections import Counter, OrderedDict, deque
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

    def record(self, topic: str, queue: int, batch: Batch) -> None:
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
        if all(b.first != batch.first for b in batches):
            batches.append(batch)

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

    def holds(self, topic: str) -> bool:
        return topic in self._topics
