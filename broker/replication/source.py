"""What a broker answers a follower's fetch (``GET /v1/replica/{pq}``): the records of a physical queue it holds, from
the offset the follower holds durably on (DESIGN.md invariant 12).

The leader of an open head takes the fetch's offset as that follower's acknowledgement (leader.ReplicaTracker) and,
when it has nothing new, holds the fetch until it appends (up to ``wait_ms``) so that a send waits one round trip
for its copies, not a poll period. A sealed segment is served by any broker holding it, up to its own end.
Only durable records are served: a copy never holds a record its leader could still lose.
"""

from __future__ import annotations

from ..routing import RouteTable
from ..storage import OffsetOutOfRange, Run
from ..storage_threads import StorageThreads
from ..writes import Writer
from .leader import FETCH_WAIT_MS_MAX

FETCH_BYTES_MAX = 8 * 1024 * 1024
READ_THREADS = 4


class FetchSource:
    def __init__(self, me: str, routes: RouteTable, writer: Writer):
        self.me = me
        self.routes = routes
        self.writer = writer
        self._threads = StorageThreads(READ_THREADS, "replica-read")

    def stop(self) -> None:
        self._threads.stop()

    async def fetch(self, pq_name: str, offset: int, follower: str, wait_ms: int, max_n: int,
                    start: int) -> tuple[list[Run], int]:
        """Runs from ``offset`` on and this broker's durable end of the queue (``start`` when it holds none)."""
        seg = self.routes.hosted.get(pq_name)
        led = seg is not None and seg.broker == self.me
        if led:
            self.writer.replicas.fetched(seg, follower, offset)
        if pq_name not in self.writer.store:
            return [], start
        pq = self.writer.store.get(pq_name)
        if led and offset >= pq.max_offset and wait_ms > 0 and seg.state != "sealed":
            await self.writer.replicas.wait_appended(pq_name, min(wait_ms, FETCH_WAIT_MS_MAX) / 1000)
        end = pq.max_offset
        if offset >= end:
            return [], end
        try:
            runs = pq.try_read_runs(max(offset, pq.min_offset), max_n, FETCH_BYTES_MAX)
            if runs is None:
                runs = await self._threads.run(pq.read_runs, max(offset, pq.min_offset), max_n, FETCH_BYTES_MAX)
        except OffsetOutOfRange:
            return [], end
        return runs, end
