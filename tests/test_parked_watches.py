"""Watch streams of one topic written by the parked-watch writer (meta/api/parked_watches.py), on a real node, read
byte for byte off their connections: each change arrives once, framed as aiohttp frames the stream (HTTP/1.1
chunks, or bare bytes over HTTP/1.0), with the ids a resume needs; what the writer cannot do (a deleted topic, a
reader that stopped reading, a stream of several topics) the stream does itself, in order."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest
import yarl
from prometheus_client import CollectorRegistry, Counter, Gauge

from meta.api.parked_watches import SSE_KEEPALIVE_S, WATCH_HEALTH_CHECK_S, WRITE_BUFFER_BYTES_MAX, ParkedWatches
from meta.api.topic_changes import answer_changes
from meta.changefeed import ChangeFeed
from tests.support import cluster as cluster_mod
from tests.support.meta_http import wait_until
from tests.support.metrics import scrape, value

READ_TIMEOUT_S = 30
PARKED = "stator_meta_watch_events_written_parked_total"


class Stream:
    """One ``GET /v1/watch`` on a connection of its own, its answer read byte for byte (chunked or not)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer
        self.chunked = False
        self._body = b""

    @classmethod
    async def open(cls, url: str, auth: str, query: str, version: str = "HTTP/1.1") -> "Stream":
        u = yarl.URL(url)
        reader, writer = await asyncio.open_connection(u.host, u.port)
        s = cls(reader, writer)
        head = [f"GET /v1/watch?{query} {version}", f"Host: {u.host}:{u.port}", f"Authorization: {auth}"]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode())
        raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT_S)
        lines = raw.decode("latin-1").split("\r\n")
        assert lines[0].split()[1] == "200", raw
        headers = {k.lower(): v for k, v in (line.split(": ", 1) for line in lines[1:] if line)}
        assert headers["content-type"] == "text/event-stream"
        s.chunked = headers.get("transfer-encoding") == "chunked"
        return s

    async def _more(self) -> None:
        if not self.chunked:
            data = await asyncio.wait_for(self.reader.read(65536), READ_TIMEOUT_S)
            assert data, "the stream ended"
            self._body += data
            return
        size_line = await asyncio.wait_for(self.reader.readuntil(b"\r\n"), READ_TIMEOUT_S)
        size = int(size_line, 16)   # a bad chunk header fails here
        assert size > 0, "the stream ended"
        chunk = await asyncio.wait_for(self.reader.readexactly(size + 2), READ_TIMEOUT_S)
        assert chunk.endswith(b"\r\n"), chunk
        self._body += chunk[:-2]

    async def event(self) -> tuple[str, int, dict]:
        """The next event that is not a comment: (event, id, data)."""
        while True:
            while b"\n\n" not in self._body:
                await self._more()
            raw, self._body = self._body.split(b"\n\n", 1)
            fields = dict(line.split(": ", 1) for line in raw.decode().split("\n") if not line.startswith(":"))
            if fields:
                return fields["event"], int(fields["id"]), json.loads(fields["data"])

    def close(self) -> None:
        self.writer.close()


@pytest.fixture
async def node(tmp_path):
    async with cluster_mod.one_meta_node(str(tmp_path)) as n:
        yield n


async def _create(c, url: str, topic: str, queues: int = 2) -> int:
    s, b, _ = await c.call("POST", url + "/v1/topics", json={"topic": topic, "queues": queues})
    assert s == 201, b
    return b["version"]


async def _change(c, url: str, topic: str, value_: str) -> int:
    s, b, _ = await c.call("PUT", url + f"/v1/topics/{topic}/config", json={"k": value_})
    assert s == 200, b
    return b["version"]


async def _written(c, url: str) -> float:
    return value(await scrape(c.session, url), PARKED)


@pytest.mark.parametrize("http_version", ["HTTP/1.1", "HTTP/1.0"])
async def test_each_change_reaches_a_parked_stream_once_framed_as_its_connection_is(node, http_version):
    c, m, auth = node
    v0 = await _create(c, m, "t")
    stream = await Stream.open(m, auth, f"topics=t&after={v0}", http_version)
    try:
        assert stream.chunked == (http_version == "HTTP/1.1")
        versions = []
        for i in range(3):
            before = await _written(c, m)
            # parked again after each change (its own pass, or the writer's): the next one is the writer's
            await wait_until(lambda: _parked_count(c, m, 1), READ_TIMEOUT_S, "the stream parked")
            v = await _change(c, m, "t", f"v{i}")
            event, id_, data = await stream.event()
            assert (event, id_, data["version"], data["topic"]) == ("route", v, v, "t")
            assert data["config"] == {"k": f"v{i}"}
            versions.append(id_)
            await wait_until(lambda: _grew(c, m, before), READ_TIMEOUT_S, "the writer wrote it")
        assert versions == sorted(set(versions))
        # a change of another topic, then one of t: t's is the stream's next event (what the writer advanced the
        # stream to, its own pass relies on: the deleted topic's test below fails without it)
        other = await _create(c, m, "other")
        v = await _change(c, m, "t", "last")
        assert v > other
        assert (await stream.event())[1] == v
        # the same bytes a stream's own first pass sends for that version
        fresh = await Stream.open(m, auth, f"topics=t&after={v - 1}", http_version)
        try:
            assert await fresh.event() == ("route", v, (await _route(c, m, "t")))
        finally:
            fresh.close()
    finally:
        stream.close()


async def _route(c, url: str, topic: str) -> dict:
    async with c.session.get(url + f"/v1/routes/{topic}", headers=c.headers("client")) as r:
        assert r.status == 200
        return json.loads(await r.read())


async def _parked_count(c, url: str, n: int) -> bool:
    return value(await scrape(c.session, url), "stator_meta_watch_streams_parked") == n


async def _grew(c, url: str, before: float) -> bool:
    return await _written(c, url) > before


async def test_a_deleted_topic_and_a_stream_of_two_topics_are_written_by_their_own_streams(node):
    c, m, auth = node
    v0 = await _create(c, m, "gone")
    await _create(c, m, "kept")
    one = await Stream.open(m, auth, f"topics=gone&after={v0}")
    two = await Stream.open(m, auth, f"topics=gone,kept&after={v0}")
    try:
        assert (await two.event())[0] == "route"   # kept's creation, after v0
        # the one-topic stream parks; the other never does (it waits on the change feed)
        await wait_until(lambda: _parked_count(c, m, 1), READ_TIMEOUT_S, "the one-topic stream parked")
        before = await _written(c, m)
        v = await _change(c, m, "gone", "x")
        assert (await one.event())[1] == v
        assert (await two.event())[1] == v
        await wait_until(lambda: _grew(c, m, before), READ_TIMEOUT_S, "the writer wrote one")
        assert await _written(c, m) == before + 1   # the one-topic stream's; the other wrote its own
        s, b, _ = await c.call("DELETE", m + "/v1/topics/gone")
        assert s == 200, b
        for stream in (one, two):
            event, id_, data = await stream.event()
            assert (event, data["topic"]) == ("deleted", "gone") and id_ >= data["version"] > v
        assert await _written(c, m) == before + 1
    finally:
        one.close()
        two.close()


async def test_a_parked_stream_whose_reader_went_away_ends_and_leaves_nothing_parked(node):
    """The server cancels the handler of a closed connection (runtime/serve.py handler_cancellation): a parked
    stream is unparked on the way out, not left for the writer to find."""
    c, m, auth = node
    v0 = await _create(c, m, "left")
    stream = await Stream.open(m, auth, f"topics=left&after={v0}")
    await wait_until(lambda: _parked_count(c, m, 1), READ_TIMEOUT_S, "the stream parked")
    stream.close()

    async def ended() -> bool:
        return value(await scrape(c.session, m), "stator_meta_watch_streams") == 0
    await wait_until(ended, READ_TIMEOUT_S, "the stream's handler ended")
    assert value(await scrape(c.session, m), "stator_meta_watch_streams_parked") == 0


class _Transport:
    def __init__(self, buffered: int = 0):
        self.written = b""
        self.buffered = buffered

    def is_closing(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def write(self, data: bytes) -> None:
        self.written += data


def _stream(topic: str, after: int, scanned_to: int):
    return SimpleNamespace(topics=[topic], after=after, sent={}, scanned_to=scanned_to, last_id=after,
                           quiet_since=0.0)


def _watches(feed: ChangeFeed, route: tuple[int, bytes] | None, follows: list[bool] = [True]) -> ParkedWatches:
    reads = SimpleNamespace(route_bytes=lambda topic: route, follows_log=lambda: follows[0])
    registry = CollectorRegistry()
    return ParkedWatches(reads, feed, Counter("w", "w", registry=registry), Gauge("p", "p", registry=registry))


async def test_a_reader_that_stopped_reading_is_woken_and_nothing_is_written_for_it():
    feed = ChangeFeed()
    watches = _watches(feed, (2, b'{"version":2}'))
    slow, quick = _Transport(WRITE_BUFFER_BYTES_MAX + 1), _Transport()
    streams = [_stream("t", 1, 0), _stream("t", 1, 0)]
    waits = [asyncio.create_task(watches.wait(s, t, True)) for s, t in zip(streams, (slow, quick))]
    await asyncio.sleep(0)   # both parked
    feed.publish(2, {"t"})
    await watches.answer("t")
    await asyncio.wait_for(waits[0], 1.0)
    assert slow.written == b""
    assert not waits[1].done()
    assert quick.written == b'28\r\nevent: route\nid: 2\ndata: {"version":2}\n\n\r\n'
    assert (streams[1].sent, streams[1].last_id, streams[1].scanned_to) == ({"t": 2}, 2, 2)
    assert streams[0].sent == {} and streams[0].scanned_to == 0
    watches.close()
    await asyncio.gather(waits[1], return_exceptions=True)


async def test_a_change_published_before_the_stream_parks_is_not_waited_past():
    feed = ChangeFeed()
    watches = _watches(feed, (2, b'{"version":2}'))
    stream = _stream("t", 1, 1)   # its last pass saw version 1
    feed.publish(2, {"t"})        # published before it parks: the writer found nothing parked
    await asyncio.wait_for(watches.wait(stream, _Transport(), True), 1.0)


async def test_a_route_applied_past_the_version_published_waits_for_its_publish():
    feed = ChangeFeed()
    feed.publish(2, {"t"})
    watches = _watches(feed, (3, b'{"version":3}'))   # applied at 3, published up to 2
    transport, stream = _Transport(), _stream("t", 2, 2)
    waiting = asyncio.create_task(watches.wait(stream, transport, False))
    await asyncio.sleep(0)
    await watches.answer("t")
    assert transport.written == b"" and not waiting.done()
    feed.publish(3, {"t"})
    await watches.answer("t")
    assert transport.written == b'event: route\nid: 3\ndata: {"version":3}\n\n'
    assert stream.scanned_to == 3 and not waiting.done()
    watches.close()
    await asyncio.gather(waiting, return_exceptions=True)


async def test_parked_streams_get_their_keepalives_and_are_woken_when_the_node_stops_following_the_log():
    feed, follows = ChangeFeed(), [True]
    watches = _watches(feed, (1, b"{}"), follows)
    loop = asyncio.get_running_loop()
    quiet, recent = _stream("t", 1, 0), _stream("t", 1, 0)
    quiet.quiet_since, recent.quiet_since = loop.time() - SSE_KEEPALIVE_S, loop.time() + 3600
    chunked, bare = _Transport(), _Transport()
    waits = [asyncio.create_task(watches.wait(s, t, c)) for s, t, c in ((quiet, chunked, True), (recent, bare, False))]
    tending = asyncio.create_task(watches.tend())
    try:
        deadline = loop.time() + READ_TIMEOUT_S
        while not chunked.written:
            assert loop.time() < deadline, "no keepalive"
            await asyncio.sleep(0.05)
        assert chunked.written == b"d\r\n: keepalive\n\n\r\n" and bare.written == b""
        assert quiet.quiet_since > loop.time() - 2 * WATCH_HEALTH_CHECK_S
        assert not any(w.done() for w in waits)
        follows[0] = False
        await asyncio.wait_for(asyncio.gather(*waits), READ_TIMEOUT_S)
        assert bare.written == b""
    finally:
        tending.cancel()
        await asyncio.gather(tending, return_exceptions=True)


async def test_a_failed_route_read_wakes_the_topic_s_parked_streams_and_the_writer_goes_on():
    """One task writes for every topic (meta/api/topic_changes.py): a topic it cannot write for is left to its
    streams, and the next topic's change is still written."""
    def route_bytes(topic: str):
        if topic == "bad":
            raise RuntimeError("render failed")
        return 2, b'{"version":2}'

    feed = ChangeFeed()
    registry = CollectorRegistry()
    watches = ParkedWatches(SimpleNamespace(route_bytes=route_bytes), feed, Counter("w", "w", registry=registry),
                            Gauge("p", "p", registry=registry))
    bad, good = _Transport(), _Transport()
    streams = [_stream("bad", 1, 0), _stream("good", 1, 0)]
    waits = [asyncio.create_task(watches.wait(s, tr, False)) for s, tr in zip(streams, (bad, good))]
    writer = asyncio.create_task(answer_changes(feed, [watches]))
    try:
        await asyncio.sleep(0)
        assert not any(w.done() for w in waits), "both parked"
        feed.publish(2, {"bad", "good"})
        await asyncio.wait_for(waits[0], READ_TIMEOUT_S)   # woken: its stream reads the route itself

        async def written() -> bool:
            return bool(good.written)
        await wait_until(written, READ_TIMEOUT_S, "the other topic's change written", interval_s=0.05)
        assert good.written == b'event: route\nid: 2\ndata: {"version":2}\n\n' and bad.written == b""
        assert streams[1].sent == {"good": 2} and streams[0].sent == {}
        assert not writer.done() and not waits[1].done()
    finally:
        writer.cancel()
        watches.close()
        await asyncio.gather(writer, *waits, return_exceptions=True)
