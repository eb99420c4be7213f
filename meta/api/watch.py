"""Route subscriptions: long poll (``GET /v1/routes/{topic}?after=V&wait=S``) and SSE (``GET /v1/watch``).

Both send the route rendered once per version. A parked long poll is answered by parked_polls.py, which writes the
whole HTTP answer, built once, to every connection waiting on the topic; a watch stream of one topic is written to
the same way between its passes (parked_watches.py), and any other stream waits on the change feed.
"""

from __future__ import annotations

import asyncio
import json

from aiohttp import web

from .. import limits
from ..changefeed import ANY, TOPICS
from ..image import GROUP_KEY_PREFIX, group_key
from wire.errors import invalid, rejection
from wire.params import nonneg_int, seconds
from runtime.server import requires

from .http import JSON, service
from .keys import ADMISSIONS, PARKED_POLLS, PARKED_WATCHES
from .parked_polls import AnsweredResponse, Outcome
from .parked_watches import KEEPALIVE, SSE_KEEPALIVE_S, WATCH_HEALTH_CHECK_S, sse


@requires("client", "broker")
async def long_poll_route(request: web.Request) -> web.StreamResponse:
    svc = service(request)
    topic = request.match_info["topic"]
    after = nonneg_int(request.query.get("after"), "after", -1)
    wait_s = seconds(request.query.get("wait"), "wait", 0.0, limits.LONG_POLL_WAIT_S_MAX)
    await svc.reads.before_read({k: v for k, v in request.query.items() if k in ("min_version", "consistency")})
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    waiting = False
    gzip_ok = "gzip" in request.headers.get("Accept-Encoding", "")
    try:
        while True:
            seen = svc.feed.version
            route = await svc.reads.route_for(topic, gzip_ok)
            if route is None:
                raise rejection(404, "TOPIC_NOT_FOUND", f"topic {topic!r} does not exist", topic=topic)
            if route[0] > after:
                headers = {"Content-Encoding": "gzip", "Vary": "Accept-Encoding"} if route[2] else None
                return web.Response(body=route[1], content_type=JSON, headers=headers)
            left = deadline - loop.time()
            if left <= 0:
                return web.Response(status=304)
            if not waiting:
                request.app[ADMISSIONS]["long_polls"].enter()
                waiting = True
            if await request.app[PARKED_POLLS].wait(request, topic, after, gzip_ok, left, seen) is Outcome.ANSWERED:
                return AnsweredResponse()
    finally:
        if waiting:
            request.app[ADMISSIONS]["long_polls"].leave()


@requires("client", "broker")
async def watch(request: web.Request) -> web.StreamResponse:
    svc = service(request)
    raw_topics = request.query.get("topics", "")
    topics = sorted({t for t in raw_topics.split(",") if t})
    if len(topics) > limits.WATCH_TOPICS_PER_STREAM_MAX:
        raise invalid(f"at most {limits.WATCH_TOPICS_PER_STREAM_MAX} topics per watch stream")
    after = nonneg_int(request.query.get("after") or request.headers.get("Last-Event-ID"), "after", -1)
    # A read like any other (API.md): min_version (bounded by wait) and consistency hold the stream's first pass
    # until this node has applied what the reader already saw elsewhere. Ignored, a reader resuming on a node a
    # version behind got a topic as of an older version than the one it had asked for.
    await svc.reads.before_read({k: v for k, v in request.query.items() if k in ("min_version", "consistency", "wait")})
    request.app[ADMISSIONS]["watch_streams"].enter()
    try:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                           "X-Accel-Buffering": "no"})
        await resp.prepare(request)
        # The parked-watch writer writes to the connection beside aiohttp's writer, framed as aiohttp frames it
        chunked = resp.headers.get("Transfer-Encoding") == "chunked"
        parked = request.app[PARKED_WATCHES] if len(topics) == 1 else None
        await WatchStream(svc, resp, topics, after, parked, request.transport, chunked).run()
    except (ConnectionResetError, asyncio.CancelledError):
        pass
    finally:
        request.app[ADMISSIONS]["watch_streams"].leave()
    return resp


class WatchStream:
    """One SSE stream. Its ids are a safe resume point: when it sends ``id: V``, every change of a watched topic up to
    V has been sent. So a reader that reconnects with ``after=<last id>`` misses nothing, whatever node it reaches.

    Each pass takes the version P this node has published, reads each changed topic's route (version and bytes of one
    moment) and sends those at or below P in version order; a topic already applied past P waits for the next pass,
    so an older change never follows a newer id, and whatever a reader resumes after, the newest state of every
    topic reaches it. Deletes go last, with id P, and an all-topic pass that sent nothing else ends with
    ``caught_up`` (id P) so readers learn how far the log has been followed even when no watched topic changed.
    All-topic streams (brokers) also carry each group's lock table as a ``group`` event (id: the group's version),
    ordered with the routes, so a broker learns every token change from the same resumable stream.

    A node that has no leader, or lags its leader's commit by more than WATCH_LAG_ENTRIES_MAX, ends its streams so
    readers move to a node that follows the log (a cut-off node would otherwise keep streams alive with keepalives).

    A stream of one topic parks between its passes (``parked``: parked_watches.py), which writes the changes of its
    topic to its connection (``transport``, ``chunked``: framed as aiohttp frames this response) and advances
    ``sent``, ``last_id``, ``scanned_to`` and ``quiet_since`` as a pass would.
    """

    def __init__(self, svc, resp: web.StreamResponse, topics: list[str], after: int, parked=None, transport=None,
                 chunked: bool = False):
        self.svc = svc
        self.resp = resp
        self.topics = topics
        self.after = after
        self.sent: dict[str, int] = {}     # topic -> version sent (-1: deleted)
        self.scanned_to = after            # every change up to here has been sent
        self.last_id = after
        self.quiet_since = 0.0             # loop time of the last bytes sent
        self._parked = parked
        self._transport = transport
        self._chunked = chunked

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        self.quiet_since = loop.time()
        # All-topic streams (brokers) wake for any applied version: their caught_up is what lets a broker write again
        # after a registration or an unfence, which need not change any topic. A pass looks only at changed topics.
        key = ANY if not self.topics else TOPICS if len(self.topics) > 1 else self.topics[0]
        while True:
            if not self.svc.reads.follows_log():
                await self.resp.write(sse("unavailable", self.last_id,  # an id that promises nothing new
                                           b'{"reason":"this meta node does not follow the leader; reconnect elsewhere"}'))
                return
            if await self._pass():
                self.quiet_since = loop.time()
                # Another pass finds something only if a version was published meanwhile (while a write waited);
                # else it would read every watched route again for nothing, a second read per wake-up.
                if self.svc.feed.version > self.scanned_to:
                    continue
            if self._parked is not None:
                # Parked, it is health-checked and kept alive by the writer (ParkedWatches.tend), not by a timer each.
                # Woken, it writes what the writer could not (a reader far behind): the next event, or its keepalive
                await self._parked.wait(self, self._transport, self._chunked)
                changed = False
            else:
                changed = await self.svc.feed.wait(key, WATCH_HEALTH_CHECK_S)
            if not changed and loop.time() - self.quiet_since >= SSE_KEEPALIVE_S:
                await self.resp.write(KEEPALIVE)
                self.quiet_since = loop.time()

    def _candidates(self) -> tuple[list[str], bool]:
        """Names to look at, and whether they come from the change log (then a missing one was deleted since)."""
        if self.topics:
            return self.topics, False
        changed = self.svc.feed.changed_since(self.scanned_to)
        if changed is not None:
            return sorted(changed), True
        names = self.svc.read(lambda im: sorted(im.topics) + [group_key(g) for g in sorted(im.groups)])
        present = set(names)
        return names + [n for n, v in self.sent.items() if v >= 0 and n not in present], False

    async def _pass(self) -> bool:
        published = self.svc.feed.version
        names, from_log = self._candidates()
        listed, gone = [], []
        for name in names:
            if name.startswith(GROUP_KEY_PREFIX):
                if not self.topics:  # lock tables are for brokers, which read all-topic streams
                    self._group(name, published, listed)
                continue
            route = self.svc.reads.route_bytes(name)   # version and bytes of one moment: sent as they are
            if route is None:
                if self.sent.get(name) != -1 and (from_log or self.sent.get(name, -1) >= 0):
                    gone.append(name)
            elif max(self.after, self.sent.get(name, -1)) < route[0] <= published:
                listed.append((route[0], name, route[1]))
        listed.sort()
        wrote = False
        for version, name, body in listed:
            kind = "group" if name.startswith(GROUP_KEY_PREFIX) else "route"
            await self.resp.write(sse(kind, version, body))
            self.sent[name] = self.last_id = version
            wrote = True
        for name in gone:
            await self.resp.write(sse("deleted", published, json.dumps({"topic": name, "version": published}).encode()))
            self.sent[name] = -1
            self.last_id = published
            wrote = True
        self.scanned_to = max(self.scanned_to, published)
        if not self.topics and published > self.last_id:
            await self.resp.write(sse("caught_up", published, b'{"version":%d}' % published))
            self.last_id = published
            wrote = True
        return wrote


    def _group(self, key: str, published: int, listed: list) -> None:
        """A group's lock table joins the pass like a route (groups are never deleted)."""
        event = self.svc.reads.group_bytes(key)
        if event is not None and max(self.after, self.sent.get(key, -1)) < event[0] <= published:
            listed.append((event[0], key, event[1]))


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/routes/{topic}", long_poll_route)
    app.router.add_get("/v1/watch", watch)
