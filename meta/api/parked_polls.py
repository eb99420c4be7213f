"""Long polls parked on a topic, answered together: the route's whole HTTP answer is built once per version and
written to every parked connection from one task.

A parked long poll used to be a handler waiting on the change feed: a change woke each one, and each read the
route, built a response and wrote it through aiohttp, ~60 µs of a node's loop per subscriber (a bare aiohttp
handler woken the same way costs ~30). Here one task per node reads the route once, builds the status line,
headers and body once per encoding, and writes those bytes to each waiting connection in turn: the answers leave
in a few milliseconds, and the handlers finish afterwards, with nothing left to write.

A handler whose answer was written this way returns ``AnsweredResponse``. Only a keep-alive HTTP/1.1 GET is
answered directly; any other request, a deleted topic, or a failed render wakes its handler, which answers as
every read does.
"""

from __future__ import annotations

import asyncio
import email.utils
import enum
from dataclasses import dataclass
from collections.abc import Callable, Iterable

from aiohttp import web
from aiohttp.http import SERVER_SOFTWARE, HttpVersion11
from prometheus_client import Counter

from .topic_changes import Waiters

ANSWER_SLICE = 64       # answers written per loop pass (~12 µs each): the write's own answer is not queued behind


class Outcome(enum.Enum):
    ANSWERED = "answered"   # the whole answer was written to the connection
    CHANGED = "changed"     # the route changed: the handler answers itself
    TIMED_OUT = "timed_out"


class AnsweredResponse(web.StreamResponse):
    """Returned by a handler whose answer ParkedPolls wrote: aiohttp writes nothing more and keeps the connection.

    aiohttp's ``prepare`` and ``write_eof`` return at once for a response whose EOF was sent, and the server keeps
    the connection open when the response's ``keep_alive`` is true; both are private state (aiohttp 3.9 to 3.14),
    held to by tests/test_parked_polls.py on the real server (a second request on the same connection)."""

    def __init__(self) -> None:
        super().__init__(status=200)
        self._eof_sent = True
        self._keep_alive = True


@dataclass(slots=True, eq=False)   # eq=False: hashed by identity, a key of Waiters
class _Poll:
    transport: asyncio.Transport | None
    after: int
    gzip_ok: bool
    direct: bool
    fut: asyncio.Future


class ParkedPolls:
    def __init__(self, reads, feed, version_header: str, answered: Counter):
        self.reads = reads
        self.feed = feed
        self.version_header = version_header
        self.answered = answered   # answers written here
        self._parked = Waiters()

    async def wait(self, request: web.Request, topic: str, after: int, gzip_ok: bool, timeout_s: float,
                   seen_version: int) -> Outcome:
        """Park the request until its topic's route passes ``after`` (or ``timeout_s``). ``seen_version``: the
        feed's version before the caller read the route. A change published since (a big route renders on a
        thread) may have found no poll parked and been passed over: CHANGED at once, and the caller reads again."""
        if self.feed.version != seen_version:
            return Outcome.CHANGED
        loop = asyncio.get_running_loop()
        transport = request.transport
        direct = (transport is not None and request.method == "GET" and request.version == HttpVersion11
                  and request.keep_alive)
        poll = _Poll(transport, after, gzip_ok, direct, loop.create_future())
        timer = loop.call_later(timeout_s, _settle, poll.fut, Outcome.TIMED_OUT)
        try:
            with self._parked.parked(topic, poll):
                return await poll.fut
        finally:
            timer.cancel()

    def topics(self) -> Iterable[str]:
        return self._parked.topics()

    def on_park(self, callback: Callable[[], None]) -> None:
        self._parked.on_park = callback

    async def answer(self, topic: str) -> None:
        polls = self._parked.of(topic)
        if not polls:
            return
        routes = {}
        for gzip_ok in {p.gzip_ok for p in polls}:
            routes[gzip_ok] = await self.reads.route_for(topic, gzip_ok)
        # The tick hands the loop a command's changes and its proposer's answer together: yield once, so that
        # the write's own answer leaves before its subscribers' (tests/test_fanout.py).
        await asyncio.sleep(0)
        wires: dict[bool, bytes] = {}
        written = 0
        try:
            for poll in self._parked.of(topic):   # as parked now: the render may have awaited a thread
                if poll.fut.done():
                    continue
                route = routes.get(poll.gzip_ok)
                if route is None:   # deleted, or parked with an encoding not rendered above: the handler reads again
                    poll.fut.set_result(Outcome.CHANGED)
                    continue
                if route[0] <= poll.after:
                    continue   # it has seen this version already (read on a node ahead of this one)
                if not poll.direct or poll.transport.is_closing():
                    poll.fut.set_result(Outcome.CHANGED)
                    continue
                wire = wires.get(poll.gzip_ok)
                if wire is None:
                    wire = wires[poll.gzip_ok] = self._wire(route[1], route[2])
                poll.transport.write(wire)
                poll.fut.set_result(Outcome.ANSWERED)
                written += 1
                if written % ANSWER_SLICE == 0:
                    await asyncio.sleep(0)
        finally:
            # Counted once a pass: an increment per answer took the counter's lock 333 times a change per node.
            if written:
                self.answered.inc(written)

    def _wire(self, body: bytes, gzipped: bool) -> bytes:
        """The whole HTTP answer, as aiohttp would write it for ``web.Response(body=body, content_type=JSON)``."""
        head = [b"HTTP/1.1 200 OK", b"Content-Type: application/json", b"Content-Length: %d" % len(body),
                b"Date: " + email.utils.formatdate(usegmt=True).encode(), b"Server: " + SERVER_SOFTWARE.encode(),
                self.version_header.encode() + b": %d" % self.reads.applied_version]
        if gzipped:
            head += [b"Content-Encoding: gzip", b"Vary: Accept-Encoding"]
        return b"\r\n".join(head) + b"\r\n\r\n" + body

    def wake_all(self, topic: str) -> None:
        for poll in self._parked.of(topic):
            _settle(poll.fut, Outcome.CHANGED)

    def close(self) -> None:
        self._parked.cancel_all()


def _settle(fut: asyncio.Future, outcome: Outcome) -> None:
    if not fut.done():
        fut.set_result(outcome)
