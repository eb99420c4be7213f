"""Watch streams of one topic parked between its changes, written together: the event is built once per version
and written to every parked stream from one task.

A watch stream used to wait on the change feed: a change woke each one, and each read the route, built its event
and wrote it through aiohttp's writer, ~50 µs of a node's loop per subscriber (16 ms a round for the 333 streams a
node holds in ``ops.bench.fanout``). Here a stream of one topic that has sent everything parks between passes;
after a change of its topic one task reads the route once, frames the event once (as a chunk when the response is
chunked, as aiohttp would frame it) and writes those bytes to each parked stream's connection in turn, advancing the
stream as its own pass would have. The stream's handler stays parked, without a timer: the same task checks once
every WATCH_HEALTH_CHECK_S that the node still follows the log (else it wakes every parked stream, which then ends)
and writes the keepalive of each stream quiet for SSE_KEEPALIVE_S (a timer per stream woke each one every second:
333 wake-ups a second on each node of the benchmark, a third of its CPU per change).

What the writer cannot do, the stream does itself, as before: a deleted topic, a route applied past the version
published, a connection that is closing or holds more than WRITE_BUFFER_BYTES_MAX unsent wakes the stream, whose
own pass then writes (and waits for its reader). Streams of several topics and all-topic streams (brokers) never
park here. One task drives this writer and the parked polls' (topic_changes.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter, Gauge

from .topic_changes import Waiters

SSE_KEEPALIVE_S = 15.0
WATCH_HEALTH_CHECK_S = 1.0   # how often idle streams check that their node still follows the leader
ANSWER_SLICE = 64                  # events written per loop pass (~10 µs each): a write's own answer is not queued behind
WRITE_BUFFER_BYTES_MAX = 64 * 1024   # unsent bytes past which a stream writes its own events (and waits for its reader)


@dataclass(slots=True, eq=False)   # eq=False: hashed by identity, a key of Waiters
class _Parked:
    stream: Any   # meta.api.watch.WatchStream
    transport: asyncio.Transport
    chunked: bool
    fut: asyncio.Future


class ParkedWatches:
    def __init__(self, reads, feed, written: Counter, parked: Gauge):
        """``written``: counts the events written here; ``parked``: set to the streams parked here."""
        self.reads = reads
        self.feed = feed
        self.written = written
        self._parked = Waiters()
        parked.set_function(self._parked.count)

    async def wait(self, stream, transport: asyncio.Transport | None, chunked: bool) -> None:
        """Park ``stream`` (a meta.api.watch.WatchStream of one topic) until it must run a pass itself. Meanwhile
        the changes of its topic and its keepalives are written to ``transport`` here, and the stream's state
        advanced. A change published since the stream's last pass (its ``scanned_to``) found it not parked: returns
        at once."""
        if self.feed.version != stream.scanned_to or transport is None:
            return
        topic = stream.topics[0]
        loop = asyncio.get_running_loop()
        parked = _Parked(stream, transport, chunked, loop.create_future())
        with self._parked.parked(topic, parked):
            await parked.fut

    def topics(self) -> Iterable[str]:
        return self._parked.topics()

    def on_park(self, callback: Callable[[], None]) -> None:
        self._parked.on_park = callback

    async def answer(self, topic: str) -> None:
        if not self._parked.of(topic):
            return
        # The tick hands the loop a command's changes and its proposer's answer together: yield once, so that
        # the write's own answer leaves before its subscribers' (as the parked polls do)
        await asyncio.sleep(0)
        published = self.feed.version
        route = self.reads.route_bytes(topic)
        if route is None or route[0] > published:
            # Deleted: each stream says so itself. Applied past what is published: the publish of it comes next,
            # and writes it then (a stream never sends a version above the id it promises)
            if route is None:
                self.wake_all(topic)
            return
        version, body = route
        event = sse("route", version, body)
        chunk = b"%x\r\n%s\r\n" % (len(event), event)
        now = asyncio.get_running_loop().time()
        written = 0
        try:
            for parked in self._parked.of(topic):   # as parked now: each slice below yields the loop
                stream = parked.stream
                if parked.fut.done() or max(stream.after, stream.sent.get(topic, -1)) >= version:
                    continue   # woken already, or it has this version (it resumed after it)
                if not self._writable(parked):
                    continue
                parked.transport.write(chunk if parked.chunked else event)
                stream.sent[topic] = stream.last_id = version
                stream.scanned_to = max(stream.scanned_to, published)
                stream.quiet_since = now
                written += 1
                if written % ANSWER_SLICE == 0:
                    await asyncio.sleep(0)
        finally:
            if written:   # once a pass, as the parked polls' answers
                self.written.inc(written)

    def wake_all(self, topic: str) -> None:
        for parked in self._parked.of(topic):
            _settle(parked.fut)

    async def tend(self) -> None:
        """Until cancelled: every WATCH_HEALTH_CHECK_S, wake every parked stream when this node no longer follows
        the log (each then says so and ends), else write the keepalive of each one quiet for SSE_KEEPALIVE_S."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(WATCH_HEALTH_CHECK_S)
            follows = self.reads.follows_log()
            now = loop.time()
            for topic in list(self._parked.topics()):
                if not follows:
                    self.wake_all(topic)
                    continue
                for parked in self._parked.of(topic):
                    if not parked.fut.done() and now - parked.stream.quiet_since >= SSE_KEEPALIVE_S:
                        if self._writable(parked):
                            parked.transport.write(KEEPALIVE_CHUNK if parked.chunked else KEEPALIVE)
                            parked.stream.quiet_since = now

    def _writable(self, parked: _Parked) -> bool:
        """Whether bytes may be written to a parked stream's connection here; if not, the stream is woken to write
        its own (and wait for its reader, or end with its connection)."""
        transport = parked.transport
        if transport.is_closing() or transport.get_write_buffer_size() > WRITE_BUFFER_BYTES_MAX:
            _settle(parked.fut)
            return False
        return True

    def close(self) -> None:
        self._parked.cancel_all()


KEEPALIVE = b": keepalive\n\n"
KEEPALIVE_CHUNK = b"%x\r\n%s\r\n" % (len(KEEPALIVE), KEEPALIVE)


def sse(event: str, version: int, data: bytes) -> bytes:
    return b"event: " + event.encode() + b"\nid: " + str(version).encode() + b"\ndata: " + data + b"\n\n"


def _settle(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)
