"""Parked long polls answered whole by the parked-poll writer (meta/api/parked_polls.py), on a real node, read byte
for byte off their connections: the answer is the one the handler would give, the connection serves the next
request, and what the writer cannot answer (a closing connection, a deleted topic, a version not yet passed, a
failed render) is answered by the handler as before."""

from __future__ import annotations

import asyncio
import gzip
import json
from types import SimpleNamespace

import pytest
import yarl
from aiohttp.http import HttpVersion11
from prometheus_client import CollectorRegistry, Counter

from meta.api.parked_polls import Outcome, ParkedPolls
from meta.api.topic_changes import answer_changes
from meta.changefeed import ChangeFeed
from tests.support import cluster as cluster_mod
from tests.support.meta_http import wait_until
from tests.support.metrics import scrape, value

ANSWER_TIMEOUT_S = 30
BIG_QUEUES = 100   # a route over ROUTE_GZIP_MIN_BYTES (16 KiB), rendered on a worker thread (64 queues and up)
PARKED = "stator_meta_long_polls_answered_parked_total"


class Connection:
    """One keep-alive HTTP/1.1 connection, requests written and answers read byte for byte."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str, auth: str):
        self.reader, self.writer, self.host, self.auth = reader, writer, host, auth

    @classmethod
    async def open(cls, url: str, auth: str) -> "Connection":
        u = yarl.URL(url)
        reader, writer = await asyncio.open_connection(u.host, u.port)
        return cls(reader, writer, f"{u.host}:{u.port}", auth)

    def send(self, target: str, *headers: str, version: str = "HTTP/1.1") -> None:
        head = [f"GET {target} {version}", f"Host: {self.host}", f"Authorization: {self.auth}", *headers]
        self.writer.write(("\r\n".join(head) + "\r\n\r\n").encode())

    async def answer(self) -> tuple[int, dict[str, str], bytes]:
        head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), ANSWER_TIMEOUT_S)
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.lower(): v for k, v in (line.split(": ", 1) for line in lines[1:] if line)}
        body = await asyncio.wait_for(self.reader.readexactly(int(headers.get("content-length", "0"))),
                                      ANSWER_TIMEOUT_S)
        return int(lines[0].split()[1]), headers, body

    def close(self) -> None:
        self.writer.close()


async def _parked(c, url: str, n: int) -> None:
    async def enough() -> bool:
        return value(await scrape(c.session, url), "stator_meta_long_poll_waiters") == n
    await wait_until(enough, 30, f"{n} long polls parked")


async def _create(c, url: str, topic: str, queues: int) -> int:
    s, b, _ = await c.call("POST", url + "/v1/topics", json={"topic": topic, "queues": queues})
    assert s == 201, b
    return b["version"]


@pytest.fixture
async def node(tmp_path):
    async with cluster_mod.one_meta_node(str(tmp_path)) as n:
        yield n


async def test_a_parked_poll_gets_the_handlers_answer_whole_and_its_connection_serves_the_next_request(node):
    c, m, auth = node
    v0 = await _create(c, m, "t", 4)
    conn = await Connection.open(m, auth)
    try:
        conn.send(f"/v1/routes/t?after={v0}&wait=30")
        await _parked(c, m, 1)
        s, b, _ = await c.call("PUT", m + "/v1/topics/t/config", json={"k": "v"})
        assert s == 200, b
        status, headers, body = await conn.answer()
        assert status == 200, body
        assert json.loads(body)["version"] == b["version"]
        assert headers["content-type"] == "application/json"
        assert int(headers["x-meta-version"]) >= b["version"]
        assert "date" in headers and "server" in headers and "content-encoding" not in headers
        assert "connection" not in headers   # kept alive, as aiohttp says it for HTTP/1.1
        # the same bytes and headers as the handler's own answer to a read of the route
        async with c.session.get(m + "/v1/routes/t", headers=c.headers("client")) as r:
            assert r.status == 200 and await r.read() == body
            assert {h.lower() for h in r.headers} == set(headers)
        assert value(await scrape(c.session, m), PARKED) == 1
        # aiohttp wrote nothing more on the connection, and kept it: the next requests are answered on it
        conn.send(f"/v1/routes/t?after={b['version']}&wait=0")
        status, _, empty = await conn.answer()
        assert (status, empty) == (304, b"")
        conn.send("/v1/routes/t")
        status, _, again = await conn.answer()
        assert (status, again) == (200, body)
    finally:
        conn.close()


async def test_each_parked_poll_gets_its_encoding_and_one_closing_its_connection_gets_the_handlers_answer(node):
    c, m, auth = node
    v0 = await _create(c, m, "big", BIG_QUEUES)
    plain, packed, closing = [await Connection.open(m, auth) for _ in range(3)]
    try:
        plain.send(f"/v1/routes/big?after={v0}&wait=30")
        packed.send(f"/v1/routes/big?after={v0}&wait=30", "Accept-Encoding: gzip")
        closing.send(f"/v1/routes/big?after={v0}&wait=30", "Connection: close")
        await _parked(c, m, 3)
        s, b, _ = await c.call("PUT", m + "/v1/topics/big/config", json={"k": "v"})
        assert s == 200, b
        (s1, h1, plain_body), (s2, h2, packed_body), (s3, h3, closing_body) = await asyncio.gather(
            plain.answer(), packed.answer(), closing.answer())
        assert (s1, s2, s3) == (200, 200, 200)
        assert "content-encoding" not in h1 and len(plain_body) > 16 * 1024
        assert h2["content-encoding"] == "gzip" and h2["vary"] == "Accept-Encoding"
        assert gzip.decompress(packed_body) == plain_body == closing_body
        assert json.loads(plain_body)["version"] == b["version"]
        # the handler answered the poll that asked to close, and closed: the writer answers keep-alive polls only
        assert h3["connection"] == "close"
        assert await asyncio.wait_for(closing.reader.read(), ANSWER_TIMEOUT_S) == b""
        assert value(await scrape(c.session, m), PARKED) == 2
    finally:
        for conn in (plain, packed, closing):
            conn.close()


async def test_a_deleted_topic_answers_its_parked_polls_404_and_a_poll_ahead_of_the_change_stays_parked(node):
    c, m, auth = node
    v0 = await _create(c, m, "gone", 2)
    parked, ahead = await Connection.open(m, auth), await Connection.open(m, auth)
    try:
        parked.send(f"/v1/routes/gone?after={v0}&wait=30")
        # it read version v0 + 5 elsewhere: the next change does not pass it, so its wait runs out
        ahead.send(f"/v1/routes/gone?after={v0 + 5}&wait=3")
        await _parked(c, m, 2)
        s, b, _ = await c.call("PUT", m + "/v1/topics/gone/config", json={"k": "v"})
        assert s == 200 and b["version"] <= v0 + 5, b
        status, _, body = await parked.answer()
        assert status == 200 and json.loads(body)["version"] == b["version"]
        status, _, body = await ahead.answer()   # its wait ran out: the change did not answer it
        assert (status, body) == (304, b"")
        parked.send(f"/v1/routes/gone?after={b['version']}&wait=30")
        await _parked(c, m, 1)
        s, b, _ = await c.call("DELETE", m + "/v1/topics/gone")
        assert s == 200, b
        status, _, body = await parked.answer()
        assert status == 404 and json.loads(body)["error"]["code"] == "TOPIC_NOT_FOUND"
    finally:
        parked.close()
        ahead.close()


class _Transport:
    def __init__(self) -> None:
        self.written = b""

    def write(self, data: bytes) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return False


async def test_a_failed_render_wakes_its_polls_for_their_handlers_and_the_writer_goes_on():
    """In process, with the route reads standing in: a render that raises (nothing on a real node raises on
    demand) must not leave its polls parked until their wait runs out, nor end the writer's task."""
    class Reads:
        applied_version = 1
        fail = True

        async def route_for(self, topic: str, gzip_ok: bool):
            if self.fail:
                raise RuntimeError("render failed")
            return 2, b'{"version":2}', False

    feed, reads, registry = ChangeFeed(), Reads(), CollectorRegistry()
    parked = ParkedPolls(reads, feed, "X-Meta-Version", Counter("answered", "answered", registry=registry))
    writer = asyncio.create_task(answer_changes(feed, [parked]))
    try:
        request = SimpleNamespace(transport=_Transport(), method="GET", version=HttpVersion11, keep_alive=True)
        for version, outcome in ((1, Outcome.CHANGED), (2, Outcome.ANSWERED)):
            waiting = asyncio.create_task(parked.wait(request, "t", 1, False, ANSWER_TIMEOUT_S, feed.version))
            await asyncio.sleep(0)   # parked
            feed.publish(version, {"t"})
            assert await asyncio.wait_for(waiting, ANSWER_TIMEOUT_S) is outcome
            reads.fail = False
        assert request.transport.written.startswith(b"HTTP/1.1 200 OK\r\n")
        assert request.transport.written.endswith(b'\r\n\r\n{"version":2}')
        assert not writer.done()
    finally:
        writer.cancel()
        await asyncio.gather(writer, return_exceptions=True)


async def test_a_change_published_while_the_route_was_read_is_not_waited_past():
    """The handler reads the route, then parks. A change published in between (a big route renders on a thread)
    finds nothing parked, so the writer passes it over: the poll must not park, or it waits for the next change."""
    class Reads:
        applied_version = 1

        async def route_for(self, topic: str, gzip_ok: bool):
            return 2, b'{"version":2}', False

    feed, registry = ChangeFeed(), CollectorRegistry()
    parked = ParkedPolls(Reads(), feed, "X-Meta-Version", Counter("answered", "answered", registry=registry))
    writer = asyncio.create_task(answer_changes(feed, [parked]))
    try:
        seen = feed.version   # the handler's read of the route begins
        feed.publish(2, {"t"})
        await asyncio.sleep(0)   # the writer finds no poll on t
        request = SimpleNamespace(transport=_Transport(), method="GET", version=HttpVersion11, keep_alive=True)
        outcome = await asyncio.wait_for(parked.wait(request, "t", 1, False, ANSWER_TIMEOUT_S, seen), 1.0)
        assert outcome is Outcome.CHANGED and request.transport.written == b""
    finally:
        writer.cancel()
        await asyncio.gather(writer, return_exceptions=True)


async def test_the_writer_sleeps_while_nothing_is_parked_and_answers_a_poll_parked_after():
    """With nothing parked the writer waits for something to park, not on the feed (a wake-up per change cost ~2%
    of a node's CPU at one writer); a poll that parks after changes it slept through, and a change that comes right
    after the poll parked, before the writer ran, are still answered."""
    class Reads:
        applied_version = 1

        async def route_for(self, topic: str, gzip_ok: bool):
            return feed.version, b'{"version":%d}' % feed.version, False

    feed, registry = ChangeFeed(), CollectorRegistry()
    parked = ParkedPolls(Reads(), feed, "X-Meta-Version", Counter("answered", "answered", registry=registry))
    writer = asyncio.create_task(answer_changes(feed, [parked]))
    try:
        for version in (2, 3, 4):
            await asyncio.sleep(0)
            assert feed.waiting() == 0   # nothing parked: the writer does not follow the feed
            feed.publish(version, {"t"})
        request = SimpleNamespace(transport=_Transport(), method="GET", version=HttpVersion11, keep_alive=True)
        waiting = asyncio.create_task(parked.wait(request, "t", 4, False, ANSWER_TIMEOUT_S, feed.version))
        await asyncio.sleep(0)   # parked; the writer is woken but has not run yet
        feed.publish(5, {"t"})
        assert await asyncio.wait_for(waiting, ANSWER_TIMEOUT_S) is Outcome.ANSWERED
        assert request.transport.written.endswith(b'{"version":5}')
    finally:
        writer.cancel()
        await asyncio.gather(writer, return_exceptions=True)
