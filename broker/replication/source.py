"""What a broker answers a follower's fetch (``POST /v1/replica``): for every physical queue the follower copies from
it, the records past the offset the follower holds durably (DESIGN.md invariant 12).

One fetch covers every queue a follower copies from this broker (Kafka's fetch covers every partition of a broker
pair): a thousand queues with three copies made two thousand parked requests, one per copy, which exhausted the
brokers' connection pools and their CPU. The leader of an open head takes each queue's offset as that follower's
acknowledgement (leader.ReplicaTracker) and, when none has anything new, holds the fetch until it appends (up to
``wait_ms``), so a send waits one round trip for its copies, not a poll period. A sealed segment is served by any
broker holding it, up to its own end. Only durable records are served: a copy never holds a record its leader
could still lose.
"""

from __future__ import annotations

import time

from ..routing import RouteTable
from ..storage import OffsetOutOfRange
from ..storage_threads import StorageThreads
from ..writes import Writer
from . import frames
from .leader import FETCH_WAIT_MS_MAX

FETCH_BYTES_MAX = 16 * 1024 * 1024      # one answer's records, over every queue
QUEUE_BYTES_MAX = 4 * 1024 * 1024       # one queue's share of it, so that one busy queue never starves the others
FETCH_RECORDS_MAX = 1_000               # records per queue per answer
COPIES_PER_FETCH_MAX = 20_000           # queues one fetch names (a follower splits more over several)
READ_THREADS = 4


class FetchSource:
    def __init__(self, me: str, routes: RouteTable, writer: Writer):
        self.me = me
        self.routes = routes
        self.writer = writer
        self._threads = StorageThreads(READ_THREADS, "replica-read")

    def stop(self) -> None:
        self._threads.stop()

    async def fetch(self, follower: str, queues: list[tuple[str, int]], wait_ms: int) -> list[frames.Section]:
        """``queues``: (physical queue, offset the follower holds durably). Sections of those with records past it;
        waits up to ``wait_ms`` for an append when none has any."""
        for pq, offset in queues:
            seg = self.routes.hosted.get(pq)
            if seg is not None and seg.broker == self.me:
                self.writer.replicas.fetched(seg, follower, offset)
        deadline = time.monotonic() + min(wait_ms, FETCH_WAIT_MS_MAX) / 1000
        while True:
            seen = self.writer.replicas.append_count
            sections = await self._read(queues)
            left = deadline - time.monotonic()
            if sections or left <= 0:
                return sections
            await self.writer.replicas.wait_appended(seen, left)

    async def _read(self, queues: list[tuple[str, int]]) -> list[frames.Section]:
        out, budget = [], FETCH_BYTES_MAX
        for pq_name, offset in queues:
            if budget <= 0:
                break
            if pq_name not in self.writer.store:
                continue
            pq = self.writer.store.get(pq_name)
            end = pq.max_offset
            if offset >= end:
                continue
            want = min(budget, QUEUE_BYTES_MAX)
            start = max(offset, pq.min_offset)
            try:
                runs = pq.try_read_runs(start, FETCH_RECORDS_MAX, want)
                if runs is None:
                    runs = await self._threads.run(pq.read_runs, start, FETCH_RECORDS_MAX, want)
            except OffsetOutOfRange:
                continue
            if not runs:
                continue
            budget -= sum(len(r.records) for r in runs)
            out.append(frames.Section(pq_name, end, self._batches(pq_name, runs), runs))
        return out

    def _batches(self, pq_name: str, runs: list) -> list[tuple[int, int, int, int]]:
        seg = self.routes.held(pq_name)
        if seg is None or seg.logic_start is None:
            return []
        last = runs[-1].offset + runs[-1].count
        return [(b.producer, b.seq, b.first, b.count) for b in
                self.writer.producers.covering(seg.topic, seg.queue, seg.gen, seg.logic(runs[0].offset),
                                               seg.logic(last))]
