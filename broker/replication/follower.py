"""The follower's side: one stream per broker this broker copies from, bringing the records of every copy it holds
of that broker's segments into physical queues of the same names (DESIGN.md invariant 12).

- An active or sealing head is copied from its leader over a stream (source.py): the leader pushes records as it
  writes them; this broker writes them, and after each sync tells the leader, per queue, the offset its copy holds
  durably (the acknowledgement) and the offset it has written. Writing the next records while the last are synced,
  and acknowledging as soon as a sync ends, keeps a send's wait near one sync and two hops.
- A sealing segment this broker was elected to seal is not fetched any more: its end is this copy's end, which the
  meta link reports (broker/meta_link.py); a copy never takes a record after its end was read (``Writer.seal``).
- A sealed segment is fetched until this copy reaches the segment's end, from whichever of its copies has more
  (its sealer first, then its leader, then the others): a copy that missed the end of its leader's writes, or a
  broker back on a new disk. Asking only the sealer and the leader left a segment whose two had both lost their
  disks with no way back from the one copy that held it (the chaos runner's broker_wipe).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import aiohttp
import structlog

from wire.caller import Backoff
from wire.waits import wait_set
from wire.tls import connector

from ..routing import RouteTable, Segment, segment_of
from ..writes import Writer
from . import frames
from .source import COPIES_PER_FETCH_MAX, STREAM_HEARTBEAT_S

log = structlog.get_logger("broker.replication")

FETCH_TIMEOUT_S = 10.0          # a catch-up's fetch (answered at once) and a stream's opening
FETCH_BACKOFF = Backoff(0.05, 1.0, jitter=False)
CATCH_UP_BACKOFF = Backoff(0.2, 10.0, jitter=False)   # a sealed copy no holder can lengthen now: ask again later
CATCH_UPS_MAX = 10_000           # sealed copies catching up at once
COPIES_HELD_PER_REPORT_MAX = 1_024   # meta's SEALS_PER_REPORT_MAX: copies one POST .../copies-held names
LISTING_BACKOFF = Backoff(0.5, 30.0, jitter=False)   # asking meta again for the sealed copies after a failure
LISTING_SLOT_WAIT_S = 0.5        # a listed copy waits this long for one of the CATCH_UPS_MAX catch-ups to end
EPOCH_CHECK_S = 1.0              # an idle stream checks this often that it still streams under this registration


class _Link:
    """What a stream from one source has to tell it: the copies written since the last acknowledgement, and
    whether the routes changed (then it names every copy)."""

    def __init__(self) -> None:
        self.dirty = asyncio.Event()
        self.written: dict[str, Segment] = {}
        self.written_since = 0.0   # perf_counter when the first of ``written`` arrived
        self.full = False


def physical_end(seg: Segment) -> int | None:
    return seg.physical(seg.logic_end) if seg.logic_end is not None and seg.logic_start is not None else None


def source(seg: Segment, me: str) -> str | None:
    """Whom an open copy fetches from: its leader; nobody when this broker must seal it itself, or for a sealed
    segment (``holders``)."""
    if seg.state == "sealed" or (seg.sealer or seg.broker) == me:
        return None
    return seg.broker


def holders(seg: Segment, me: str) -> list[str]:
    """The brokers a sealed copy may catch up from, in the order to ask."""
    return [b for b in dict.fromkeys([seg.sealer or seg.broker, seg.broker, *seg.in_sync, *seg.replicas]) if b != me]


class Replicator:
    def __init__(self, me: str, routes: RouteTable, writer: Writer, token: str, ssl_context=None,
                 unreachable: Callable[[str], None] = lambda broker: None):
        self.me = me
        self._unreachable = unreachable   # told of a source whose connection failed (MetaLink.peer_down)
        self.routes = routes
        self.writer = writer
        self._headers = {"Authorization": f"Bearer {token}", "Accept": frames.CONTENT_TYPE}
        self._ssl_context = ssl_context
        self._http: aiohttp.ClientSession | None = None
        self._sessions: dict[str, asyncio.Task] = {}   # source broker -> its stream's loop
        self._links: dict[str, _Link] = {}              # source broker -> its open stream's state
        self._catching_up: dict[str, asyncio.Task] = {}   # sealed copy (physical queue) -> its catch-up
        # Sealed copies older than the routes name (they carry each queue's newest segments only), from meta's
        # listing: physical queue -> segment, and the addresses of the brokers they name
        self._older: dict[str, Segment] = {}
        self._older_addresses: dict[str, str] = {}
        self._listing: asyncio.Task | None = None
        self._relist = False   # asked to list again while a listing ran (a drain placed another copy here)
        # A sealed copy this broker holds whole that meta does not count in sync yet (a drain placed it here): told
        # to meta (MetaLink.copies_held), which then names it instead of the draining broker's
        self.on_whole: Callable[[list[tuple[Segment, int]]], None] = lambda whole: None

    async def start(self) -> None:
        self._http = aiohttp.ClientSession(connector=connector(self._ssl_context),
                                           timeout=aiohttp.ClientTimeout(total=FETCH_TIMEOUT_S, sock_connect=1.0))

    async def stop(self) -> None:
        tasks = [*self._sessions.values(), *self._catching_up.values(), *([self._listing] if self._listing else [])]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._http is not None:
            await self._http.close()

    def follow(self, topic: str) -> None:
        """A route of ``topic`` was applied: fetch every copy of it that is behind, from its source."""
        # A sealed segment this broker led counts too: back on a new disk, its copy of it is empty
        sealed_led = [s for s in self.routes.hosted.values() if s.state == "sealed"]
        for seg in [*self.routes.copies.values(), *sealed_led]:
            if seg.topic != topic or not self._wanted(seg):
                continue
            if seg.state == "sealed":
                self._start_catch_up(seg.physical_queue)
                continue
            src = source(seg, self.me)
            if src not in self._sessions:
                self._sessions[src] = asyncio.create_task(self._session(src), name=f"replica-stream {src}")
        for link in self._links.values():   # the copies a stream names may have changed: it names them all again
            link.full = True
            link.dirty.set()

    def recover(self, listing: Callable[[str | None], Awaitable[dict]]) -> None:
        """Registered (maybe on a new disk): catch up every sealed copy meta names that is not whole here, older
        ones included. ``listing``: a page of them after a cursor (MetaLink.sealed_copies)."""
        if self._listing is None or self._listing.done():
            self._listing = asyncio.create_task(self._recover(listing), name="replica-recover")
        else:
            self._relist = True

    async def _recover(self, listing: Callable[[str | None], Awaitable[dict]]) -> None:
        after, failures = None, 0
        while True:
            try:
                page = await listing(after)
            except asyncio.CancelledError:
                raise
            except Exception as e:   # meta away: ask again, less often
                failures += 1
                log.info("sealed_copies_listing_failed", error=f"{type(e).__name__}: {e}")
                await asyncio.sleep(LISTING_BACKOFF.delay_s(failures))
                continue
            failures = 0
            self._older_addresses.update(page["addresses"])
            segs = [segment_of(c["topic"], c["queue"], c["segment"]) for c in page["copies"]]
            whole = [w for w in map(self._whole, segs) if w is not None]
            for i in range(0, len(whole), COPIES_HELD_PER_REPORT_MAX):   # one report per page, each bounded
                self.on_whole(whole[i:i + COPIES_HELD_PER_REPORT_MAX])
            for seg in segs:
                if self.routes.held(seg.physical_queue) is None and self._wanted(seg):
                    while len(self._catching_up) >= CATCH_UPS_MAX:   # the rest wait for a free slot, not dropped
                        await asyncio.sleep(LISTING_SLOT_WAIT_S)
                    self._older[seg.physical_queue] = seg
                    self._start_catch_up(seg.physical_queue)
            after = page["next"]
            if after is None:
                if not self._relist:
                    return
                self._relist = False

    def _whole(self, seg: Segment) -> tuple[Segment, int] | None:
        """(seg, its end) when this broker holds the sealed ``seg`` whole but meta does not count it in sync yet."""
        end = physical_end(seg)
        if seg.state == "sealed" and self.me not in seg.in_sync and end is not None \
                and self.writer.max_physical(seg) >= end:
            return seg, end
        return None

    def _start_catch_up(self, pq: str) -> None:
        if pq not in self._catching_up and len(self._catching_up) < CATCH_UPS_MAX:
            self._catching_up[pq] = asyncio.create_task(self._catch_up(pq), name=f"replica-catch-up {pq}")

    def _wanted(self, seg: Segment) -> bool:
        end = physical_end(seg)
        if end is not None:
            return self.writer.max_physical(seg) < end
        return source(seg, self.me) is not None

    def _copies_from(self, src: str) -> list[Segment]:
        return [s for s in self.routes.copies.values() if source(s, self.me) == src and self._wanted(s)]

    def _epoch(self) -> int:
        """This broker's registration epoch, which a leader adds to the in-sync set with it (0 before the first)."""
        return self.writer.session.epoch or 0

    def _streamed_from(self, src: str) -> list[Segment]:
        """The copies one stream from ``src`` names (more are not copied from it)."""
        return self._copies_from(src)[:COPIES_PER_FETCH_MAX]

    async def _catch_up(self, pq: str) -> None:
        """Bring a sealed copy to its segment's end from whichever holder has more; when none has (every one that
        answers is as short as this copy), ask again later, less and less often."""
        failures = 0
        try:
            while True:
                seg = self.routes.held(pq) or self._older.get(pq)
                if seg is None or seg.state != "sealed" or not self._wanted(seg):
                    self._older.pop(pq, None)
                    whole = self._whole(seg) if seg is not None else None
                    if whole is not None:
                        self.on_whole([whole])
                    return
                took = False
                for b in holders(seg, self.me):
                    try:
                        took = await self._fetch_once(b, [seg]) > 0
                    except asyncio.CancelledError:
                        raise
                    except Exception as e:   # that holder is down or refusing: the next one
                        log.info("replica_catch_up_failed", pq=pq, source=b, error=f"{type(e).__name__}: {e}")
                    if took:
                        break
                if took:
                    failures = 0
                    continue
                failures += 1
                await asyncio.sleep(CATCH_UP_BACKOFF.delay_s(failures))
        finally:
            self._catching_up.pop(pq, None)

    async def _session(self, src: str) -> None:
        """Stream from ``src`` until no copy here is behind it; reconnect after a failure, later each time."""
        failures = 0
        try:
            while self._copies_from(src):
                try:
                    await self._stream(src)
                    failures = 0
                except asyncio.CancelledError:
                    raise
                except Exception as e:   # the source is down or refusing: try again, later each time
                    if isinstance(e, aiohttp.ClientConnectionError):   # not an answer: its process may be gone
                        self._unreachable(src)
                    if failures == 0:
                        log.warning("replica_stream_failed", source=src, copies=len(self._copies_from(src)),
                                    error=f"{type(e).__name__}: {e}")
                    failures += 1
                    await asyncio.sleep(FETCH_BACKOFF.delay_s(failures))
        finally:
            self._sessions.pop(src, None)

    def _positions(self, copies: list[Segment], full: bool) -> bytes:
        return frames.encode_positions([frames.Position(s.physical_queue, self.writer.max_physical(s),
                                                        self.writer.next_physical(s)) for s in copies], full)

    async def _stream(self, src: str) -> None:
        """One stream from ``src``: returns once no copy here is behind it; raises when it breaks off."""
        copies = self._streamed_from(src)
        if not copies:
            return
        address = self.routes.address(copies[0].topic, src)
        if address is None:
            raise LookupError(f"no address for broker {src}")
        if self.writer.session.epoch is None:
            # Not registered yet: a leader adds a copy to the in-sync set under the registration it streams with
            raise ConnectionResetError("not registered with meta yet")
        link = self._links[src] = _Link()
        try:
            epoch = self._epoch()
            async with self._http.ws_connect(address + "/v1/replica/stream",
                                             params={"follower": self.me, "epoch": str(epoch)},
                                             headers=self._headers, heartbeat=STREAM_HEARTBEAT_S,
                                             max_msg_size=frames.ANSWER_BYTES_MAX) as ws:
                await ws.send_bytes(self._positions(copies, full=True))
                acks = asyncio.create_task(self._acknowledge(src, ws, link, epoch), name=f"replica-acks {src}")
                try:
                    async for msg in ws:
                        if msg.type != aiohttp.WSMsgType.BINARY:
                            break
                        arrived = time.perf_counter()
                        for seg, n in await self._take(src, frames.decode(msg.data), durable=False):
                            if n:
                                if not link.written:
                                    link.written_since = arrived
                                link.written[seg.physical_queue] = seg
                        link.dirty.set()
                        if acks.done():
                            break
                finally:
                    acks.cancel()
                    await asyncio.gather(acks, return_exceptions=True)
                if acks.done() and not acks.cancelled() and acks.exception() is not None:
                    raise acks.exception()
                if self._copies_from(src):   # it ended while copies here are still behind: the source went away
                    raise aiohttp.ServerDisconnectedError(f"the stream ended: {ws.close_code} {ws.exception()}")
        finally:
            if self._links.get(src) is link:
                del self._links[src]

    async def _acknowledge(self, src: str, ws: aiohttp.ClientWebSocketResponse, link: _Link, epoch: int) -> None:
        """After each sync of what the stream brought, tell the source where those copies stand; after a change of
        the routes, where every copy from it stands; close the stream once no copy here is behind it, or once the
        acknowledgements fail (a failed sync): the source would send nothing more, and the stream must not stay."""
        try:
            await self._acknowledge_until_done(src, ws, link, epoch)
        except Exception:
            await ws.close()
            raise

    async def _acknowledge_until_done(self, src: str, ws: aiohttp.ClientWebSocketResponse, link: _Link,
                                      epoch: int) -> None:
        while True:
            if not await wait_set(link.dirty, EPOCH_CHECK_S):
                if self._epoch() != epoch:
                    raise ConnectionResetError(f"registered with epoch {self._epoch()} since the stream opened")
                continue
            link.dirty.clear()
            if self._epoch() != epoch:
                # Registered (again) since the stream opened: the leader must hear the registration it may add to
                # the in-sync set (replication/leader.py), so the stream starts over under it
                raise ConnectionResetError(f"registered with epoch {self._epoch()} since the stream opened")
            synced, since = list(link.written.values()), link.written_since
            link.written.clear()
            for seg in synced:   # one after the other, no task each: one sync covers them all
                await self.writer.durable_copy(seg)
            # What was synced is acknowledged first, on its own: a segment sealed meanwhile is in no full list, and
            # its leader's last sends would wait for an acknowledgement that never came (the remaps under load of
            # tests/test_broker_e2e.py: answered after 30 s, resent by then, stored twice)
            if synced:
                await ws.send_bytes(self._positions(synced, full=False))
                if self.writer.metrics is not None:
                    self.writer.metrics.copy_acknowledge.observe(time.perf_counter() - since)
            if link.full:
                link.full = False
                copies = self._streamed_from(src)
                if not copies:
                    await ws.close()
                    return
                await ws.send_bytes(self._positions(copies, full=True))

    async def _fetch_once(self, src: str, copies: list[Segment]) -> int:
        """One fetch of ``copies`` from ``src`` (a sealed copy's catch-up); returns the records taken."""
        address = self.routes.address(copies[0].topic, src) or self._older_addresses.get(src)
        if address is None:
            raise LookupError(f"no address for broker {src}")
        body = {"follower": self.me, "epoch": self._epoch(),
                "queues": [{"pq": s.physical_queue, "offset": self.writer.max_physical(s)} for s in copies]}
        async with self._http.post(address + "/v1/replica", json=body, headers=self._headers) as r:
            if r.content_length is None or r.content_length > frames.ANSWER_BYTES_MAX:
                raise frames.FramesError(f"a fetch answer of {r.content_length} bytes (at most "
                                         f"{frames.ANSWER_BYTES_MAX}, with its length)")
            data = await r.read()   # all of it: content.read(n) returns what has arrived, maybe less
            if r.status != 200:
                raise RuntimeError(f"fetch refused: {r.status} {data[:200]!r}")
        return sum(n for _, n in await self._take(src, frames.decode(data), durable=True))

    async def _take(self, src: str, sections: list[frames.Section], durable: bool) -> list[tuple[Segment, int]]:
        """Write what ``src`` sent to the copies here (``durable``: and wait until it is synced): each copy written
        to, with the records it took."""
        took = []
        for section in sections:   # one after the other, no task each: each append only writes
            seg = self.routes.held(section.physical_queue) or self._older.get(section.physical_queue)
            if seg is None or not section.runs or (seg.state != "sealed" and source(seg, self.me) != src):
                continue   # the segment changed hands while the records travelled: what they brought is not taken
            took.append((seg, await self.writer.append_copy(seg, section.runs,
                                                            frames.with_gen(section.batches, seg.gen))))
        # The sync is asked for once every section is written: asked per section, it woke the syncer, whose round
        # could start before the next section was written, which then waited a whole round more (r3/r1 0.485
        # against 0.438 in three interleaved runs of ops.bench.replication each). One round covers every queue.
        written = [seg for seg, n in took if n]
        for seg in written:
            self.writer.ask_sync(seg)
        if durable:
            for seg in written:
                await self.writer.durable_copy(seg)
        return took
