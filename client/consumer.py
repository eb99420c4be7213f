"""``PullConsumer``: reads logic queues of one topic for one consumer group, in offset order, and commits offsets.

Each logic queue is pulled from the broker that holds its newest segment (the route's ``address``); that broker serves
the whole history of the queue, and ``next_offset`` always moves forward, across segment boundaries too.
A committed offset is the next offset to read (the last processed offset + 1), as in Kafka; -1 means the group never
committed, and reading then starts at the queue's ``min_offset`` (as a pull reports it).

A pull or commit answered ``NOT_LEADER`` re-reads the route (the queue moved) and tries again; no answer or a 5xx is
retried with backoff within ``attempts_max`` and ``deadline_s``; any other error is raised at once.

Pulls are binary batches by default (``wire_format="json"`` for JSON; client/formats.py). Either way a message's
``body`` is ``bytes``; ``text`` decodes it as UTF-8 for messages sent as text.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import aiohttp

from wire.errors import Closed, NotLeader, StatorError, TopicNotFound, Unavailable
from wire.caller import Answer, Backoff, Deadline
from wire.params import PULL_MESSAGES_MAX
from .formats import WIRE_FORMAT_DEFAULT, Body, Outgoing, Pulled, check_wire_format, accept_headers, pulled, request
from .lifecycle import TopicClient
from .routes import Route, RouteSubscription

log = logging.getLogger("stator.client.consumer")

PULL_MESSAGES_MAX_DEFAULT = 32
REQUEST_TIMEOUT_S_DEFAULT = 10.0
ATTEMPTS_MAX_DEFAULT = 6
DEADLINE_S_DEFAULT = 20.0
IDLE_PAUSE_S = 0.2           # between rounds of a poll that found nothing
PULLS_IN_FLIGHT_MAX = 8      # concurrent pulls of one poll round


@dataclass(frozen=True)
class ReceivedMessage(Body):
    """One message as pulled. ``body`` is the bytes sent (a ``str`` was sent as its UTF-8 bytes); ``is_text``: it was
    sent as text."""
    topic: str
    queue: int
    offset: int
    body: bytes
    key: str | None = None
    props: Mapping[str, str] = field(default_factory=dict)
    ts: int | None = None
    is_text: bool = False


@dataclass(frozen=True)
class PullResult:
    queue: int
    messages: list[ReceivedMessage]
    next_offset: int
    min_offset: int | None
    max_offset: int | None


def _received(topic: str, queue: int, m: Pulled) -> ReceivedMessage:
    return ReceivedMessage(topic, queue, m.offset, m.body, m.key, m.props, m.ts, m.text)


def pull_result(topic: str, queue: int, offset: int, answer: Answer) -> PullResult:
    """A pull's answer from ``offset`` of ``queue`` (either form) as a PullResult: its messages in offset order,
    from ``offset`` on, and where the next pull starts."""
    fields, got = pulled(answer)
    msgs = sorted((_received(topic, queue, m) for m in got), key=lambda m: m.offset)
    msgs = [m for m in msgs if m.offset >= offset]
    next_offset = int(fields.get("next_offset", msgs[-1].offset + 1 if msgs else offset))
    min_offset, max_offset = fields.get("min_offset"), fields.get("max_offset")
    if not msgs and isinstance(min_offset, int) and min_offset > max(offset, next_offset):
        next_offset = min_offset  # the data before min_offset is gone: continue from the oldest kept
    return PullResult(queue, msgs, max(next_offset, offset), min_offset, max_offset)


class PullConsumer(TopicClient):
    """Reads ``queues`` (default: every queue of the topic, growth included) of ``topic`` for ``group``.
    ``group`` None reads outside any group, from the queues' oldest offsets (browsing: ``stator consume``); it has
    nothing to commit. ``routes`` may be a shared ``RouteSubscription`` (then not closed with the consumer).
    ``wire_format``: pulls as ``"binary"`` batches (the default) or ``"json"``."""

    _kind = "consumer"

    def __init__(self, meta_urls: Sequence[str] | str, token: str, topic: str, group: str | None,
                 queues: Iterable[int] | None = None, *, routes: RouteSubscription | None = None,
                 route_mode: str = "sse", session: aiohttp.ClientSession | None = None,
                 ssl_context: ssl.SSLContext | None = None, max_messages: int = PULL_MESSAGES_MAX_DEFAULT,
                 request_timeout_s: float = REQUEST_TIMEOUT_S_DEFAULT,
                 attempts_max: int = ATTEMPTS_MAX_DEFAULT, deadline_s: float = DEADLINE_S_DEFAULT,
                 backoff: Backoff | None = None, idle_pause_s: float = IDLE_PAUSE_S,
                 wire_format: str = WIRE_FORMAT_DEFAULT):
        if not 1 <= max_messages <= PULL_MESSAGES_MAX:
            raise ValueError(f"max_messages must be within [1, {PULL_MESSAGES_MAX}]")
        self.topic = topic
        self.wire_format = check_wire_format(wire_format)
        self.group = group
        self.token = token
        self._queues = sorted(set(queues)) if queues is not None else None
        self._take_routes(meta_urls, token, routes, route_mode, session, ssl_context)
        self.max_messages = max_messages
        self.request_timeout_s = request_timeout_s
        self.attempts_max = attempts_max
        self.deadline_s = deadline_s
        self.backoff = backoff or Backoff()
        self.idle_pause_s = idle_pause_s
        self._positions: dict[int, int] = {}     # queue -> next offset to read
        self._closed = False

    # -- positions ---------------------------------------------------------------------------------------------
    async def queues(self) -> list[int]:
        """The queues this consumer reads: the ones given, else every queue of the topic now."""
        if self._queues is not None:
            return list(self._queues)
        route = await self.routes.get(self.topic)
        return [q["queue"] for q in route["queues"]]

    def seek(self, queue: int, offset: int) -> None:
        if offset < 0:
            raise ValueError("offset must be >= 0")
        self._positions[queue] = offset

    async def position(self, queue: int) -> int:
        """The next offset to read: the group's committed offset, or the queue's min_offset if it never committed."""
        if queue not in self._positions:
            committed = await self.committed(queue) if self.group is not None else -1
            self._positions[queue] = committed if committed >= 0 else await self.min_offset(queue)
        return self._positions[queue]

    async def committed(self, queue: int) -> int:
        """The group's committed offset of ``queue`` (-1 when never committed)."""
        answer = await self._broker_call("GET", queue, self._offsets_path(queue))
        return int(_fields(answer)["offset"])

    async def min_offset(self, queue: int, *, lock_token: int | None = None) -> int:
        """The oldest offset the logic queue still has, across all its segments: the ``min_offset`` of a pull from 0
        (the head broker serves the whole history; ``GET /v1/queues`` may describe only the segments it holds).
        ``lock_token``: the exclusive lock's token, which a pull naming an exclusive group must carry."""
        r = await self.pull(queue, offset=0, max_messages=1, lock_token=lock_token)
        if r.min_offset is not None:
            return r.min_offset
        return r.messages[0].offset if r.messages else r.next_offset

    async def offset_for_time(self, queue: int, ts_ms: int) -> int:
        """The first offset of ``queue`` stored at or after ``ts_ms`` (ms since the epoch), across its segments; the
        queue's end when every message is older (Kafka's offsetsForTimes). Seek there to read from a time."""
        if ts_ms < 0:
            raise ValueError("ts_ms must be >= 0")
        answer = await self._broker_call("GET", queue, f"/v1/queues/{quote(self.topic, safe='')}/{queue}/offset",
                                         params={"ts": ts_ms})
        return int(_fields(answer)["offset"])

    async def commit(self, queue: int, offset: int, *, lock_token: int | None = None) -> int:
        """Commit ``offset`` (the next offset to read) for the group. ``lock_token``: the exclusive lock's token
        (a superseded one gets ``StaleToken``)."""
        if offset < 0:
            raise ValueError("offset must be >= 0")
        body: dict[str, Any] = {"offset": offset}
        if lock_token is not None:
            body["token"] = lock_token
        answer = await self._broker_call("PUT", queue, self._offsets_path(queue), json=body)
        return int(_fields(answer).get("offset", offset))

    async def commit_positions(self) -> dict[int, int]:
        """Commit the current position of every queue this consumer has read."""
        done = {}
        for q, off in sorted(self._positions.items()):
            done[q] = await self.commit(q, off)
        return done

    def _offsets_path(self, queue: int) -> str:
        if self.group is None:
            raise ValueError("a consumer without a group has no committed offsets")
        return f"/v1/offsets/{quote(self.group, safe='')}/{quote(self.topic, safe='')}/{queue}"

    # -- pulling -----------------------------------------------------------------------------------------------
    async def pull(self, queue: int, offset: int | None = None, max_messages: int | None = None, *,
                   lock_token: int | None = None) -> PullResult:
        """One pull of ``queue`` from ``offset`` (default: the position). Does not move the position.
        ``lock_token``: the exclusive lock's token (a superseded one gets ``StaleToken``)."""
        if offset is None:
            offset = await self.position(queue)
        n = max_messages or self.max_messages
        params: dict[str, Any] = {"offset": offset, "max": n, "group": self.group, "token": lock_token}
        path = f"/v1/messages/{quote(self.topic, safe='')}/{queue}"
        answer = await self._broker_call("GET", queue, path, params=params, headers=accept_headers(self.wire_format))
        return pull_result(self.topic, queue, offset, answer)

    async def poll(self, timeout_s: float = 0.0) -> list[ReceivedMessage]:
        """Pull every queue once (repeating until ``timeout_s`` while nothing arrives) and move the positions past
        what is returned. Messages are in offset order within each queue."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            self._check_open()
            out = await self._poll_round()
            if out or loop.time() + self.idle_pause_s > deadline:
                return out
            await asyncio.sleep(self.idle_pause_s)

    async def _poll_round(self) -> list[ReceivedMessage]:
        queues = await self.queues()
        gate = asyncio.Semaphore(PULLS_IN_FLIGHT_MAX)

        async def one(q: int) -> PullResult | StatorError:
            async with gate:
                try:
                    return await self.pull(q)
                except (NotLeader, Unavailable) as e:  # retried inside pull already; the next round tries again
                    return e
                except StatorError as e:
                    if e.status >= 500:
                        return e
                    raise
        results = await asyncio.gather(*(one(q) for q in queues))
        out: list[ReceivedMessage] = []
        errors = [r for r in results if isinstance(r, StatorError)]
        for r in results:
            if isinstance(r, PullResult):
                out.extend(r.messages)
                self._positions[r.queue] = r.next_offset
        if errors and len(errors) == len(results):
            raise errors[0]
        for e in errors:
            log.warning("pull_failed", extra={"topic": self.topic, "error": repr(e)})
        return out

    async def __aiter__(self) -> AsyncIterator[ReceivedMessage]:
        """Every message from the positions on, until ``close()``; commit with ``commit(m.queue, m.offset + 1)``."""
        while not self._closed:
            try:
                batch = await self.poll(timeout_s=1.0)
            except (Closed, StatorError, RuntimeError):
                if self._closed:  # closed while polling: the iteration simply ends
                    return
                raise
            for m in batch:
                yield m

    # -- one broker call with route refresh and retries --------------------------------------------------------
    async def _broker_call(self, method: str, queue: int, path: str, *, params: Mapping[str, Any] | None = None,
                           json: Any = None, headers: Mapping[str, str] | None = None) -> Answer:
        """One call to the broker holding ``queue``'s head (the answer's body is a batch's bytes or parsed JSON)."""
        deadline = Deadline(self.deadline_s)
        last: StatorError | None = None
        for attempt in range(self.attempts_max):
            if deadline.expired:
                break
            try:
                route = await self._route(deadline)
                address = _address(route, queue)
                return await request(self.session(), method, address + path, token=self.token, params=params,
                                     body=Outgoing(json=json), headers=headers,
                                     timeout_s=max(0.001, min(self.request_timeout_s, deadline.left_s())))
            except StatorError as e:
                last = e
                if isinstance(e, TopicNotFound):
                    await self._refresh(None, deadline)  # raises when meta agrees the topic is gone
                elif isinstance(e, NotLeader) or e.status == 0 or e.status >= 500:
                    await self._refresh(e.route_version, deadline)
                else:
                    raise
            if not await self._pause_before_retry(attempt, deadline):
                break
        raise last or Unavailable(f"{method} {path}: no attempt within {self.deadline_s} s")


def _fields(answer: Answer) -> Mapping[str, Any]:
    return answer.body if isinstance(answer.body, dict) else {}


def _address(route: Route, queue: int) -> str:
    queues = route["queues"]
    if not 0 <= queue < len(queues):
        raise ValueError(f"queue {queue} does not exist; topic {route['topic']!r} has {len(queues)} queues")
    address = queues[queue].get("address")
    if not address:
        raise Unavailable(f"queue {queue} of {route['topic']!r}: its broker has no address in the route")
    return address.rstrip("/")
