"""The follower's side: one task per copy this broker holds and does not lead, fetching the leader's records into a
physical queue of the same name (DESIGN.md invariant 12).

- An active or sealing head is fetched from its leader. A fetch names the offset this copy holds durably, which the
  leader takes as the follower's acknowledgement, and waits there until the leader has more (up to a second).
- A sealing segment this broker was elected to seal is not fetched any more: its end is this copy's end, which the
  meta link reports (broker/meta_link.py); a copy never takes a record after its end was read.
- A sealed segment is fetched until this copy reaches the segment's end, from a broker that holds it whole (its
  sealer, else its leader): a copy that missed the end of its leader's writes, or a broker back on a new disk.
"""

from __future__ import annotations

import asyncio

import aiohttp
import structlog

from wire.caller import Backoff
from wire.tls import connector

from ..routing import RouteTable, Segment
from ..writes import Writer
from . import frames
from .leader import FETCH_WAIT_MS_MAX

log = structlog.get_logger("broker.replication")

FETCH_RECORDS_MAX = 1_000
FETCH_TIMEOUT_S = 5.0 + FETCH_WAIT_MS_MAX / 1000
FETCH_BACKOFF = Backoff(0.05, 1.0, jitter=False)
COPIES_FOLLOWED_MAX = 100_000    # fetch tasks at once (one per copy still behind)


def fetch_path(seg: Segment, offset: int, follower: str, wait_ms: int) -> str:
    return (f"/v1/replica/{seg.physical_queue}?from={offset}&follower={follower}&wait_ms={wait_ms}"
            f"&max={FETCH_RECORDS_MAX}&start={seg.physical_start}")


def physical_end(seg: Segment) -> int | None:
    return seg.physical(seg.logic_end) if seg.logic_end is not None and seg.logic_start is not None else None


def source(seg: Segment, me: str) -> str | None:
    """Whom this copy fetches from: the leader of an open head; for a sealed segment the broker that sealed it (its
    copy's end is the end), else its leader; nobody when this broker must seal it itself."""
    if seg.state == "sealed":
        for b in (seg.sealer, seg.broker):
            if b and b != me:
                return b
        return None
    if (seg.sealer or seg.broker) == me:
        return None
    return seg.broker


class Replicator:
    def __init__(self, me: str, routes: RouteTable, writer: Writer, token: str, ssl_context=None):
        self.me = me
        self.routes = routes
        self.writer = writer
        self._headers = {"Authorization": f"Bearer {token}", "Accept": frames.CONTENT_TYPE}
        self._ssl_context = ssl_context
        self._http: aiohttp.ClientSession | None = None
        self._tasks: dict[str, asyncio.Task] = {}
        self.fetches = 0          # stator_broker_replica_fetches_total
        self.records = 0          # stator_broker_replica_records_total

    async def start(self) -> None:
        self._http = aiohttp.ClientSession(connector=connector(self._ssl_context),
                                           timeout=aiohttp.ClientTimeout(total=FETCH_TIMEOUT_S, sock_connect=1.0))

    async def stop(self) -> None:
        tasks = list(self._tasks.values())
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._http is not None:
            await self._http.close()

    def follow(self, topic: str) -> None:
        """A route of ``topic`` was applied: start fetching every copy of it that is behind."""
        for pq, seg in list(self.routes.copies.items()):
            if seg.topic == topic and pq not in self._tasks and self._wanted(seg):
                if len(self._tasks) >= COPIES_FOLLOWED_MAX:
                    log.warning("copies_followed_max", pq=pq)
                    return
                self._tasks[pq] = asyncio.create_task(self._follow(pq), name=f"replica {pq}")

    def _wanted(self, seg: Segment) -> bool:
        if source(seg, self.me) is None:
            return False
        end = physical_end(seg)
        return end is None or self.writer.max_physical(seg) < end

    async def _follow(self, pq: str) -> None:
        failures = 0
        try:
            while True:
                seg = self.routes.copies.get(pq)
                if seg is None or not self._wanted(seg):
                    return
                try:
                    await self._fetch_once(seg)
                    failures = 0
                except asyncio.CancelledError:
                    raise
                except Exception as e:   # the source is down or refusing: try again, later each time
                    if failures == 0:
                        log.warning("replica_fetch_failed", pq=pq, source=source(seg, self.me),
                                    error=f"{type(e).__name__}: {e}")
                    failures += 1
                    await asyncio.sleep(FETCH_BACKOFF.delay_s(failures))
        finally:
            self._tasks.pop(pq, None)

    async def _fetch_once(self, seg: Segment) -> None:
        src = source(seg, self.me)
        address = self.routes.address(seg.topic, src)
        if address is None:
            raise LookupError(f"no address for broker {src}")
        offset = self.writer.max_physical(seg)
        wait_ms = FETCH_WAIT_MS_MAX if seg.state != "sealed" else 0
        self.fetches += 1
        async with self._http.get(address + fetch_path(seg, offset, self.me, wait_ms), headers=self._headers) as r:
            body = await r.content.read(frames.RUNS_BYTES_MAX + 1)
            if r.status != 200:
                raise RuntimeError(f"fetch refused: {r.status} {body[:200]!r}")
            if len(body) > frames.RUNS_BYTES_MAX:
                raise frames.FramesError("a fetch answer larger than its bound")
        runs = frames.decode(body)
        if runs:
            current = self.routes.copies.get(seg.physical_queue)
            if current is None or source(current, self.me) != src:
                return   # the segment changed hands while the fetch waited: what it brought is not taken
            self.records += await self.writer.append_copy(current, runs)

