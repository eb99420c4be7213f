"""The broker's data plane: send, pull across segments, consumer offsets, seal. Handlers in broker/api call this.

Offsets in and out are logic offsets. A physical queue is written only while the route says this broker holds the
queue's head, the head's logic start is decided, the broker's session is live and the write stays within the
offset budget meta granted (DESIGN.md invariants 4 and 5).
"""

from __future__ import annotations

import asyncio
import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import aiohttp

from meta.errors import MetaError, invalid, rejection

from .meta_link import MetaLink
from .offsets import OffsetStore
from .routing import RouteTable, Segment
from .storage import InvalidArgument, OffsetOutOfRange, QueueStore, Record, StorageError

MESSAGES_PER_SEND_MAX = 10_000
PULL_MAX = 1_000
PULL_BYTES_MAX = 8 * 1024 * 1024
REMOTE_TIMEOUT_S = 5.0
WRITER_THREADS = 16


def not_leader(topic: str, queue: int, head: Segment | None) -> MetaError:
    return rejection(409, "NOT_LEADER", "this broker does not hold the queue's writable segment", topic=topic,
                     queue=queue, broker=head.broker if head else None, address=head.address if head else None)


class DataPlane:
    def __init__(self, me: str, store: QueueStore, routes: RouteTable, offsets: OffsetStore, token: str):
        self.me = me
        self.store = store
        self.routes = routes
        self.offsets = offsets
        self.link: MetaLink | None = None
        self._token = token
        self._locks: dict[str, asyncio.Lock] = {}
        self._sealed_here: set[str] = set()
        self._http: aiohttp.ClientSession | None = None
        # Appends block in fsync; queues are independent files, so they may sync in parallel.
        self._writers = ThreadPoolExecutor(max_workers=WRITER_THREADS, thread_name_prefix="append")

    async def start(self) -> None:
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=REMOTE_TIMEOUT_S))

    async def stop(self) -> None:
        if self._http is not None:
            await self._http.close()
        self._writers.shutdown(wait=True)

    def _lock(self, pq: str) -> asyncio.Lock:
        lock = self._locks.get(pq)
        if lock is None:
            lock = self._locks[pq] = asyncio.Lock()
        return lock

    def _queue(self, seg: Segment, create: bool):
        if seg.physical_queue in self.store:
            return self.store.get(seg.physical_queue)
        if not create:
            return None
        return self.store.create(seg.physical_queue, seg.physical_start)

    def max_physical(self, seg: Segment) -> int:
        q = self._queue(seg, create=False)
        return q.max_offset if q is not None else seg.physical_start

    def max_offsets(self, segs: list[Segment]) -> dict[str, int]:
        return {s.physical_queue: self.max_physical(s) for s in segs}

    # -- send --------------------------------------------------------------------------------------------------
    def _writable_head(self, topic: str, queue: int) -> Segment:
        if topic not in self.routes.routes:
            raise rejection(404, "TOPIC_NOT_FOUND", f"topic {topic!r} is unknown to this broker", topic=topic)
        head = self.routes.head(topic, queue)
        if head is None:
            raise rejection(404, "QUEUE_NOT_FOUND", f"queue {queue} does not exist", topic=topic, queue=queue)
        if head.broker != self.me:
            raise not_leader(topic, queue, head)
        if head.state != "active" or head.logic_start is None or head.physical_queue in self._sealed_here:
            raise rejection(503, "SEALING", "the queue is being remapped; retry shortly", topic=topic, queue=queue)
        if not self.link.session_active():
            raise rejection(503, "FENCED", "this broker's meta session has lapsed; it takes no writes until renewed")
        return head

    async def send(self, topic: str, queue: int, messages: list[dict[str, Any]]) -> list[int]:
        if not messages or len(messages) > MESSAGES_PER_SEND_MAX:
            raise invalid(f"messages must hold 1 to {MESSAGES_PER_SEND_MAX} messages")
        payloads = [_encode(m) for m in messages]
        while True:
            head = self._writable_head(topic, queue)
            async with self._lock(head.physical_queue):
                # The route may have moved on while this send waited for the lock: the lock held must be that of
                # the segment written, or a seal of the new head could read its end while this append runs.
                if self._writable_head(topic, queue).physical_queue == head.physical_queue:
                    first = await self._append(head, payloads)
                    break
        return [head.logic(first + i) for i in range(len(payloads))]

    async def _append(self, head: Segment, payloads: list[bytes]) -> int:
        """Append within the segment's offset budget; the caller holds the segment's lock."""
        pq = self._queue(head, create=True)
        budget = max(self.link.budgets.get(head.physical_queue, 0), head.budget_end)
        if pq.max_offset + len(payloads) > budget:
            self.link.beat_soon()
            raise rejection(503, "BUDGET_EXHAUSTED", "waiting for meta to renew this queue's offset budget",
                            topic=head.topic, queue=head.queue)
        if budget - (pq.max_offset + len(payloads)) < (budget - head.physical_start) // 4:
            self.link.beat_soon()  # renew early so writers never wait for the budget
        try:
            return await asyncio.get_running_loop().run_in_executor(
                self._writers, pq.append, payloads, int(time.time() * 1000))
        except InvalidArgument as e:  # too large a record or batch, in storage's terms
            raise MetaError(str(e), code=e.code, status=413 if e.code == "TOO_LARGE" else 400) from None
        except StorageError as e:  # a failed write or fsync: the queue refuses writes until reopened
            raise rejection(503, "STORAGE_UNAVAILABLE", f"the broker could not store the batch: {e.code}",
                            topic=head.topic, queue=head.queue) from None

    async def seal(self, seg: Segment) -> int:
        """Stop writes to a sealing segment and return its exact physical end."""
        async with self._lock(seg.physical_queue):
            self._sealed_here.add(seg.physical_queue)
            return self.max_physical(seg)

    # -- pull --------------------------------------------------------------------------------------------------
    async def pull(self, topic: str, queue: int, offset: int, max_n: int) -> dict[str, Any]:
        segs = self.routes.segments(topic, queue)
        if topic not in self.routes.routes or segs is None:
            raise rejection(404, "TOPIC_NOT_FOUND", f"topic {topic!r} queue {queue} is unknown to this broker")
        head = segs[-1]
        if head.broker != self.me:
            raise not_leader(topic, queue, head)
        decided = [s for s in segs if s.logic_start is not None]
        min_offset = await self._min_offset(decided[0])
        max_offset = await self._max_offset(decided[-1])
        out = {"messages": [], "next_offset": offset, "min_offset": min_offset, "max_offset": max_offset}
        if offset < min_offset:
            out["next_offset"] = min_offset        # below the oldest kept message: move forward, never back
            return out
        if offset >= max_offset:
            out["next_offset"] = max_offset if offset > max_offset else offset
            return out
        msgs: list[RawMessage] = []
        cursor = offset
        for i, seg in enumerate(decided):
            end = seg.logic_end if seg.logic_end is not None else (
                decided[i + 1].logic_start if i + 1 < len(decided) else None)
            if end is not None and cursor >= end:
                continue
            records, physical_max = await self._read(seg, seg.physical(cursor), max_n - len(msgs))
            for r in records:
                lo = seg.logic(r.offset)
                if end is not None and lo >= end:
                    break
                msgs.append(RawMessage(lo, r.ts_ms, r.payload))
                cursor = lo + 1
            if len(msgs) >= max_n or end is None:
                break
            if cursor < seg.logic(physical_max):
                break  # the read stopped at its byte budget inside this segment
            # This segment is exhausted; anything between its last message and its end is the bounded gap of a
            # broker that died before sealing: move on to the next segment's start.
            cursor = end
        out["messages"] = msgs
        out["next_offset"] = cursor
        return out

    async def _read(self, seg: Segment, physical: int, max_n: int) -> tuple[list, int]:
        """Records from ``physical`` on, and the segment's physical end as far as its broker knows."""
        if seg.broker == self.me:
            pq = self._queue(seg, create=False)
            if pq is None:
                return [], seg.physical_start
            try:
                return pq.read(max(physical, pq.min_offset), max_records=max_n, max_bytes=PULL_BYTES_MAX), pq.max_offset
            except OffsetOutOfRange:
                return [], pq.max_offset
        body = await self._remote(seg, f"/v1/physical/{seg.physical_queue}?offset={physical}&max={max_n}")
        return ([Record(r["offset"], r["ts"], json.dumps(r["payload"], separators=(",", ":")).encode())
                 for r in body["records"]], body["max_offset"])

    async def _remote(self, seg: Segment, path: str) -> dict[str, Any]:
        if not seg.address:
            raise rejection(503, "BROKER_UNAVAILABLE", f"no address for broker {seg.broker}")
        try:
            async with self._http.get(seg.address + path, headers={"Authorization": f"Bearer {self._token}"}) as r:
                body = await r.json(content_type=None)
                if r.status != 200:
                    raise MetaError.from_dict(r.status, body)
                return body
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            raise rejection(503, "BROKER_UNAVAILABLE", f"broker {seg.broker} holding an older segment is unreachable",
                            broker=seg.broker, error=type(e).__name__) from None

    async def _min_offset(self, seg: Segment) -> int:
        if seg.broker == self.me:
            pq = self._queue(seg, create=False)
            return seg.logic(pq.min_offset) if pq is not None else seg.logic_start
        body = await self._remote(seg, f"/v1/physical/{seg.physical_queue}?offset=0&max=0")
        return seg.logic(body["min_offset"])

    async def _max_offset(self, seg: Segment) -> int:
        if seg.logic_end is not None:
            return seg.logic_end
        if seg.broker == self.me:
            return seg.logic(self.max_physical(seg))
        body = await self._remote(seg, f"/v1/physical/{seg.physical_queue}?offset=0&max=0")
        return seg.logic(body["max_offset"])

    def physical_read(self, pq_name: str, offset: int, max_n: int, ts_ms: int | None = None) -> dict[str, Any]:
        """Records of a physical queue this broker hosts, for the broker holding the queue's head."""
        seg = self.routes.hosted.get(pq_name)
        if seg is None:
            raise rejection(404, "QUEUE_NOT_FOUND", f"no physical queue {pq_name!r} here")
        pq = self._queue(seg, create=False)
        if pq is None:
            return {"records": [], "min_offset": seg.physical_start, "max_offset": seg.physical_start,
                    "offset_for_time": seg.physical_start}
        records = []
        if max_n > 0 and offset < pq.max_offset:
            records = [RawRecord(r.offset, r.ts_ms, r.payload)
                       for r in pq.read(max(offset, pq.min_offset), max_records=max_n, max_bytes=PULL_BYTES_MAX)]
        out = {"records": records, "min_offset": pq.min_offset, "max_offset": pq.max_offset}
        if ts_ms is not None:
            out["offset_for_time"] = pq.offset_for_time(ts_ms)
        return out

    # -- consumer offsets --------------------------------------------------------------------------------------
    async def commit_offset(self, group: str, topic: str, queue: int, offset: int) -> int:
        head = self.routes.head(topic, queue)
        if head is None:
            raise rejection(404, "TOPIC_NOT_FOUND", f"topic {topic!r} queue {queue} is unknown to this broker")
        if head.broker != self.me:
            raise not_leader(topic, queue, head)
        await self.offsets.commit(group, topic, queue, offset)
        return offset

    async def read_offset(self, group: str, topic: str, queue: int, local_only: bool) -> int:
        """Newest segment first, then the brokers of older segments (RocketMQ's double-read check)."""
        own = self.offsets.get(group, topic, queue)
        if own is not None or local_only:
            return -1 if own is None else own
        segs = self.routes.segments(topic, queue) or []
        asked = {self.me}
        for seg in reversed(segs):
            if seg.broker in asked:
                continue
            asked.add(seg.broker)
            try:
                body = await self._remote(seg, f"/v1/offsets/{group}/{topic}/{queue}?local=1")
            except MetaError:
                continue
            if body.get("offset", -1) >= 0:
                return body["offset"]
        return -1

    async def offset_for_time(self, topic: str, queue: int, ts_ms: int) -> int:
        """The first logic offset stored at or after ``ts_ms`` (max_offset when none), across the queue's segments."""
        segs = self.routes.segments(topic, queue)
        if topic not in self.routes.routes or segs is None:
            raise rejection(404, "TOPIC_NOT_FOUND", f"topic {topic!r} queue {queue} is unknown to this broker")
        if segs[-1].broker != self.me:
            raise not_leader(topic, queue, segs[-1])
        decided = [s for s in segs if s.logic_start is not None]
        for seg in decided:
            if seg.broker == self.me:
                pq = self._queue(seg, create=False)
                found, end = (pq.offset_for_time(ts_ms), pq.max_offset) if pq else (seg.physical_start,) * 2
            else:
                body = await self._remote(seg, f"/v1/physical/{seg.physical_queue}?offset=0&max=0&ts={ts_ms}")
                found, end = body["offset_for_time"], body["max_offset"]
            if found < end:
                return seg.logic(found)
        return await self._max_offset(decided[-1])

    async def queue_stats(self, topic: str) -> list[dict[str, Any]]:
        """Logic min and max of the queues whose head this broker holds, over their whole history."""
        route = self.routes.routes.get(topic)
        if route is None:
            raise rejection(404, "TOPIC_NOT_FOUND", f"topic {topic!r} is unknown to this broker", topic=topic)
        out = []
        for q in route["queues"]:
            segs = self.routes.segments(topic, q["queue"]) or []
            decided = [s for s in segs if s.logic_start is not None]
            if not segs or segs[-1].broker != self.me or not decided:
                continue
            out.append({"queue": q["queue"], "min_offset": await self._min_offset(decided[0]),
                        "max_offset": await self._max_offset(decided[-1])})
        return out


_json_str = json.encoder.encode_basestring_ascii  # the C escaper json.dumps uses for strings
_compact = json.JSONEncoder(separators=(",", ":")).encode


def _encode(m: Any) -> bytes:
    """A message as the stored JSON object ``{"key":..,"props":..,"body"|"body_b64":..}``, built by hand on the
    hot path: one C string escape per field instead of a full json.dumps per message."""
    if not isinstance(m, dict):
        raise invalid("each message must be an object with body or body_b64")
    body, body_b64 = m.get("body"), m.get("body_b64")
    if (body is None) == (body_b64 is None):
        raise invalid("each message needs exactly one of body and body_b64")
    if not isinstance(body if body is not None else body_b64, str):
        raise invalid("body and body_b64 must be strings")
    key, props = m.get("key"), m.get("props")
    if key is not None and not isinstance(key, str):
        raise invalid("key must be a string")
    if props is not None and (not isinstance(props, dict) or not all(isinstance(v, str) for v in props.values())):
        raise invalid("props must be an object of strings")
    field = '"body":' if body is not None else '"body_b64":'
    return ('{"key":' + (_json_str(key) if key is not None else "null") + ',"props":'
            + (_compact(props) if props else "{}") + "," + field
            + _json_str(body if body is not None else body_b64) + "}").encode()


class RawMessage(NamedTuple):
    """A stored message with its logic offset. Its payload is already a JSON object (written by ``_encode``), so
    answers splice it into the response instead of parsing and re-encoding every message."""
    offset: int
    ts: int
    payload: bytes

    def to_json(self) -> bytes:
        return b'{"offset":%d,"ts":%d,' % (self.offset, self.ts) + self.payload[1:]


class RawRecord(NamedTuple):
    """A physical record for another broker: the same splice, with the stored object under "payload"."""
    offset: int
    ts: int
    payload: bytes

    def to_json(self) -> bytes:
        return b'{"offset":%d,"ts":%d,"payload":' % (self.offset, self.ts) + self.payload + b"}"


def dumps_with_raw(value: Any) -> bytes:
    """json.dumps that writes RawMessage / RawRecord items of lists as their spliced bytes."""
    if isinstance(value, dict):
        return b"{" + b",".join(json.dumps(k).encode() + b":" + dumps_with_raw(v) for k, v in value.items()) + b"}"
    if isinstance(value, list) and value and isinstance(value[0], (RawMessage, RawRecord)):
        return b"[" + b",".join(v.to_json() for v in value) + b"]"
    return _compact(value).encode()
