"""What a broker sends the brokers that copy from it (DESIGN.md invariant 12).

- **The stream** (``GET /v1/replica/stream``, a WebSocket per broker pair): the copies of the open heads this broker
  leads. The follower names each queue it copies from here with the offset it holds durably (``offset``: its
  acknowledgement, leader.ReplicaTracker) and the offset it has written (``next``) (frames.encode_positions); it
  sends that again after each of its syncs and whenever its routes change. This broker pushes each queue's records
  past what it sent, in binary messages (frames.encode), as soon as they are written here: the follower writes and
  syncs them while this broker syncs its own, and acknowledges them without waiting for a fetch to come back.
  Pulled with a parked fetch per round (the follower's next fetch carried its acknowledgement, and whatever landed
  meanwhile waited for it), replicas=3 produced a fifth of replicas=1. At most WINDOW_RECORDS of a queue travel
  unacknowledged. RocketMQ's HA service pushes its commit log the same way, its slave reporting the offset it holds.
  The runs just written are sent from memory (``written``: the writer hands each one over as it stores it) while the
  streams keep up, within RECENT_QUEUE_BYTES_MAX a queue and RECENT_BYTES_MAX in all; a stream further behind reads
  them back from the files.
- **The fetch** (``POST /v1/replica``): a sealed segment's copy catching up from any broker that holds it, up to its
  own end; one fetch covers every queue named (a thousand queues with three copies made two thousand parked requests,
  one per copy, which exhausted the brokers' connection pools and their CPU).

Records are sent once written, before they are synced here: a follower may hold a record this broker then loses in
a crash. That record was never acknowledged (a send waits for this broker's sync too), and a broker that comes back
never leads the same gen again (replicas.broker_lost seals it and opens a new one), so no offset of one gen ever
names two records.
"""

from __future__ import annotations

import asyncio
from collections import deque

import aiohttp
import structlog
from aiohttp import web

from ..routing import RouteTable
from ..storage import OffsetOutOfRange, Run
from ..storage_threads import StorageThreads
from ..writes import Writer
from . import frames

FETCH_BYTES_MAX = 16 * 1024 * 1024      # one answer's records, over every queue
QUEUE_BYTES_MAX = 4 * 1024 * 1024       # one queue's share of it, so that one busy queue never starves the others
FETCH_RECORDS_MAX = 1_000               # records per queue per answer
log = structlog.get_logger("broker.replication")

COPIES_PER_FETCH_MAX = frames.POSITIONS_MAX   # queues one fetch or one stream names (more are not copied from there)
READ_THREADS = 4
WINDOW_RECORDS = 20_000                 # records of one queue sent on a stream and not yet acknowledged
STREAM_IDLE_S = 1.0                     # a stream with nothing to send looks again this often
STREAM_HEARTBEAT_S = 5.0                # WebSocket pings each way: a peer silent for this long is dropped
RECENT_BYTES_MAX = 64 * 1024 * 1024     # records kept in memory for the streams, over every queue
RECENT_QUEUE_BYTES_MAX = 4 * 1024 * 1024   # of one queue: a stream further behind reads them from the files


class _Stream:
    """One follower's stream: where each queue it copies stands, and the queues with something to send."""

    def __init__(self, ws: web.WebSocketResponse, follower: str, epoch: int):
        self.ws = ws
        self.follower = follower
        self.epoch = epoch   # its registration: the leader adds that one to the in-sync set
        self.sent: dict[str, list[int]] = {}   # physical queue -> [next offset to send, offset held durably there]
        self.ready: set[str] = set()
        self.wake = asyncio.Event()


class _Recent:
    """One queue's runs just written here and not yet sent to every stream that copies it: in offset order, with
    no gap."""

    __slots__ = ("runs", "bytes", "end")

    def __init__(self) -> None:
        self.runs: deque[Run] = deque()
        self.bytes = 0
        self.end = -1   # past the last run kept (kept on when every run is dropped)


class FetchSource:
    def __init__(self, me: str, routes: RouteTable, writer: Writer, driven: bool = False):
        self.me = me
        self.routes = routes
        self.writer = writer
        self._threads = StorageThreads(READ_THREADS, "replica-read", driven)   # driven: no thread (BrokerNode's)
        # Dicts as ordered sets: the streams are woken in the order they subscribed, not in their addresses' order
        # (the simulator replays a schedule exactly only if every wake-up order is the same each run)
        self._streams: dict[web.WebSocketResponse, None] = {}
        self._subscribers: dict[str, dict[_Stream, None]] = {}   # physical queue -> the streams that copy it
        self._recent: dict[str, _Recent] = {}
        self._recent_bytes = 0   # over every queue
        writer.replicas.on_written = self.written

    def stop(self) -> None:
        self._threads.stop()

    async def close_streams(self) -> None:
        """Close every stream open here (the server's shutdown: a follower then reconnects elsewhere or later)."""
        await asyncio.gather(*(ws.close(code=aiohttp.WSCloseCode.GOING_AWAY) for ws in list(self._streams)),
                             return_exceptions=True)

    async def fetch(self, follower: str, epoch: int, queues: list[tuple[str, int]]) -> list[frames.Section]:
        """``queues``: (physical queue, offset the follower holds durably). Sections of those with durable records
        past it, at once (a sealed copy catching up; open heads are streamed)."""
        for pq, offset in queues:
            seg = self.routes.hosted.get(pq)
            if seg is not None and seg.broker == self.me:
                self.writer.replicas.fetched(seg, follower, offset, epoch)
        return await self._read(queues)

    async def serve_stream(self, ws: web.WebSocketResponse, follower: str, epoch: int) -> None:
        """Push the records of every queue ``follower`` names to it, as they are written here, until either side
        closes. Its messages are binary positions (frames.decode_positions); anything else closes the stream."""
        stream = _Stream(ws, follower, epoch)
        sender = asyncio.create_task(self._push(stream), name=f"replica-push {follower}")
        self._streams[ws] = None
        try:
            async for msg in ws:
                if msg.type != aiohttp.WSMsgType.BINARY:
                    break
                try:
                    positions, full = frames.decode_positions(msg.data)
                except frames.FramesError as e:
                    await ws.close(code=aiohttp.WSCloseCode.POLICY_VIOLATION, message=str(e)[:120].encode())
                    break
                self._positions(stream, positions, full)
                if sender.done():
                    break
        finally:
            self._streams.pop(ws, None)
            for pq in stream.sent:
                self._unsubscribe(pq, stream)
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)

    def _positions(self, stream: _Stream, positions: list[frames.Position], full: bool) -> None:
        """A follower's message: where each queue it names stands on its side; ``full``: it names every queue it
        copies from here, and those it no longer names are not sent any more."""
        named = set()
        for pq, offset, written in positions:
            named.add(pq)
            seg = self.routes.hosted.get(pq)
            if seg is not None and seg.broker == self.me:
                self.writer.replicas.fetched(seg, stream.follower, offset, stream.epoch)
            at = stream.sent.get(pq)
            if at is None:
                if not full:   # an acknowledgement only (of a segment sealed meanwhile): nothing more to send
                    continue
                # from where the follower's copy ends: what it has written is not sent again
                stream.sent[pq] = [written, offset]
                self._subscribers.setdefault(pq, {})[stream] = None
                stream.ready.add(pq)
            else:
                if at[0] - at[1] >= WINDOW_RECORDS:   # its window was full: this acknowledgement may open it
                    stream.ready.add(pq)
                at[0], at[1] = max(at[0], written), max(at[1], offset)
        if full:
            for pq in set(stream.sent) - named:
                del stream.sent[pq]
                self._unsubscribe(pq, stream)
        if stream.ready:
            stream.wake.set()

    def _unsubscribe(self, pq: str, stream: _Stream) -> None:
        streams = self._subscribers.get(pq)
        if streams is not None:
            streams.pop(stream, None)
            if not streams:
                del self._subscribers[pq]
                self._forget_recent(pq)

    def written(self, pq: str, run: Run) -> None:
        """``run`` was just written to ``pq`` here: the streams that copy it send it, from memory while they keep
        up (read back from the file, each push cost the leader a tenth more at replicas=3)."""
        streams = self._subscribers.get(pq)
        if not streams:
            return
        self._keep_recent(pq, run)
        for stream in streams:
            stream.ready.add(pq)
            stream.wake.set()

    # -- the records just written, kept for the streams ---------------------------------------------------------
    def _keep_recent(self, pq: str, run: Run) -> None:
        recent = self._recent.get(pq)
        if recent is not None and recent.end != run.offset:
            self._forget_recent(pq)   # not the next run (the queue was reopened): keep only what follows on
            recent = None
        if recent is None:
            recent = self._recent[pq] = _Recent()
        recent.runs.append(run)
        recent.end = run.offset + run.count
        recent.bytes += len(run.records)
        self._recent_bytes += len(run.records)
        while recent.bytes > RECENT_QUEUE_BYTES_MAX or self._recent_bytes > RECENT_BYTES_MAX:
            if len(recent.runs) == 1:
                self._forget_recent(pq)
                return
            self._drop_oldest(recent)

    def _drop_oldest(self, recent: _Recent) -> None:
        size = len(recent.runs.popleft().records)
        recent.bytes -= size
        self._recent_bytes -= size

    def _forget_recent(self, pq: str) -> None:
        recent = self._recent.pop(pq, None)
        if recent is not None:
            self._recent_bytes -= recent.bytes

    def _trim_recent(self, pq: str) -> None:
        """Drop the runs every stream of ``pq`` has sent."""
        recent = self._recent.get(pq)
        streams = self._subscribers.get(pq)
        if recent is None or not streams:
            return
        low = min((at[0] for st in streams if (at := st.sent.get(pq)) is not None), default=0)
        while recent.runs and recent.runs[0].offset + recent.runs[0].count <= low:
            self._drop_oldest(recent)

    def _recent_runs(self, pq: str, offset: int, end: int, max_bytes: int) -> list[Run] | None:
        """The kept runs of ``pq`` from ``offset`` on and below ``end`` (the queue's written end now: what storage
        holds, whatever was kept), within FETCH_RECORDS_MAX and ``max_bytes`` (one run at least); None when they do
        not begin there (already dropped, or a copy that ends inside a run)."""
        recent = self._recent.get(pq)
        if recent is None or not recent.runs or not recent.runs[0].offset <= offset < recent.end:
            return None
        out, records, size = [], 0, 0
        for run in recent.runs:
            if run.offset < offset:
                continue
            if (not out and run.offset != offset) or run.offset + run.count > end:
                break
            if out and (records + run.count > FETCH_RECORDS_MAX or size + len(run.records) > max_bytes):
                break
            out.append(run)
            records += run.count
            size += len(run.records)
        return out or None

    async def _push(self, stream: _Stream) -> None:
        try:
            await self._push_until_closed(stream)
        except asyncio.CancelledError:
            raise
        except Exception as e:   # a stream that sends nothing more must not stay open: the follower starts over
            log.warning("replica_push_failed", follower=stream.follower, error=f"{type(e).__name__}: {e}")
            await stream.ws.close(code=aiohttp.WSCloseCode.INTERNAL_ERROR)

    async def _push_until_closed(self, stream: _Stream) -> None:
        sent = stream.sent
        loop = asyncio.get_running_loop()
        while not stream.ws.closed:
            if not stream.ready:
                stream.wake.clear()
                # A timer, not wait_for (a task per wait): only so that a stream never waits on a wake it missed
                timer = loop.call_later(STREAM_IDLE_S, stream.wake.set)
                try:
                    await stream.wake.wait()
                finally:
                    timer.cancel()
                if not stream.ready:
                    stream.ready.update(sent)
                continue
            # One more turn of the loop first: the sends it resumes in the same turn as this stream's wake append
            # too, and one push carries them all (2.0 runs a push became 2.65 at replicas=3 under
            # ops.bench.replication, whose r3 produce rose from 94k to 105k msg/s a pass, means of 6 and 10 passes)
            await asyncio.sleep(0)
            ready, stream.ready = stream.ready, set()
            sections = await self._read([(pq, at[0]) for pq in ready
                                         if (at := sent.get(pq)) is not None and at[0] - at[1] < WINDOW_RECORDS],
                                        written=True)
            for section in sections:
                pq = section.physical_queue
                at = sent.get(pq)
                if at is not None:
                    last = section.runs[-1]
                    at[0] = last.offset + last.count
                    if at[0] < section.end:   # a read's bounds stopped it: the rest goes next
                        stream.ready.add(pq)
                self._trim_recent(pq)
            if sections:
                await stream.ws.send_bytes(frames.encode(sections))

    async def _read(self, queues: list[tuple[str, int]], written: bool = False) -> list[frames.Section]:
        out, budget = [], FETCH_BYTES_MAX
        for pq_name, offset in queues:
            if budget <= 0:
                break
            if pq_name not in self.writer.store:
                continue
            pq = self.writer.store.get(pq_name)
            end = pq.next_offset if written else pq.max_offset
            if offset >= end:
                continue
            want = min(budget, QUEUE_BYTES_MAX)
            start = max(offset, pq.min_offset)
            runs = self._recent_runs(pq_name, start, end, want) if written else None
            try:
                if runs is None:
                    runs = pq.try_read_runs(start, FETCH_RECORDS_MAX, want, written)
                if runs is None:
                    runs = await self._threads.run(pq.read_runs, start, FETCH_RECORDS_MAX, want, written)
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

