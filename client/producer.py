"""``Producer``: sends messages of one topic to the broker holding each logic queue's writable segment.

Choosing the queue: the selector (by key, round robin, random, custom; see ``selection``) picks; an unpinned pick
(no key, round robin or random) is then moved by fault avoidance to a queue on an available broker.

Retrying, within ``attempts_max`` attempts and ``deadline_s`` seconds, with backoff and jitter between attempts:
- 409 ``NOT_LEADER``: the route is stale. Re-read it at once (``min_version`` = the broker's ``X-Route-Version``)
  and send again.
- 503 ``SEALING``: the queue is being remapped. Wait (bounded) for the route that shows it writable again.
- 503 ``FENCED``, no answer, 5xx: the broker is unhealthy. It is avoided for a while (a failure counts as 10 s of
  latency) and the route re-read, since the queue may have moved.
- Anything else (400, 401, 403, 404 of a deleted topic, 413) is raised at once.
A topic with ``order=strict`` and a pinned message (an explicit queue, a custom selector) are only ever retried on the
same queue; a keyed message too, unless a growth moved its key to a new queue meanwhile: it follows its key there
(brokers refuse keyed messages chosen with an older slot table, and order comes first). A ``best_tried`` message
without a key may move to another queue between attempts.

Resends are stored once (Kafka's idempotent producer): the producer draws an id at random and numbers its batches per
queue; a batch resent with the same number, to the same queue, is answered by the broker with the offsets it was
stored at, and stored again only when it never reached a copy that survives (broker/producers.py). A batch moved to
another queue between attempts (``best_tried`` without a key, or a key a growth moved) is a new batch there, and
when an earlier attempt's outcome was unknown it may be stored in both (the chaos runner's keyed producers saw it).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
import ssl
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import aiohttp

from wire.errors import Fenced, NotLeader, Sealing, StatorError, TopicNotFound, Unavailable
from .fault import LatencyFaultAvoidance
from wire.caller import Backoff, Deadline
from .formats import WIRE_FORMAT_DEFAULT, Outgoing, check_wire_format, request, send_body
from .lifecycle import TopicClient
from .routes import Route, RouteSubscription
from .selection import KeySelector, Message, QueueSelector, as_selector

log = logging.getLogger("stator.client.producer")

SEND_TIMEOUT_S_DEFAULT = 5.0
SEND_ATTEMPTS_MAX_DEFAULT = 6
SEND_DEADLINE_S_DEFAULT = 20.0
SEALING_WAIT_S_MAX = 2.0     # how long one attempt waits for the route of a sealing queue to change
BATCH_MESSAGES_MAX = 1024


@dataclass(frozen=True)
class SendResult:
    topic: str
    queue: int
    offsets: list[int]
    broker: str
    attempts: int = 1


def as_message(m: Message | Mapping[str, Any] | str | bytes) -> Message:
    if isinstance(m, Message):
        return m
    if isinstance(m, (str, bytes, bytearray)):
        return Message(m)
    if isinstance(m, Mapping):
        return Message(m["body"], m.get("key"), m.get("props"))
    raise TypeError(f"cannot send a {type(m).__name__}; use Message, a dict, str or bytes")


class Producer(TopicClient):
    """Sends to one topic. ``selector``: ``None``/``"key"`` (by key, else round robin), ``"round_robin"``, ``"random"``,
    a ``QueueSelector`` or a callable ``(route, message) -> queue``. ``fault_avoidance``: on/off, or a shared
    ``LatencyFaultAvoidance``. ``routes``: a ``RouteSubscription`` to share between producers and consumers (it is then
    not closed with the producer); without it the producer opens its own (``route_mode`` "sse" or "long_poll").
    ``wire_format``: ``"binary"`` (the batch format, the default) or ``"json"``; a ``str`` body is sent as UTF-8 text,
    ``bytes`` as they are, in either."""

    _kind = "producer"

    def __init__(self, meta_urls: Sequence[str] | str, token: str, topic: str, *,
                 selector: QueueSelector | Any = None, fault_avoidance: bool | LatencyFaultAvoidance = True,
                 routes: RouteSubscription | None = None, route_mode: str = "sse",
                 session: aiohttp.ClientSession | None = None, ssl_context: ssl.SSLContext | None = None,
                 send_timeout_s: float = SEND_TIMEOUT_S_DEFAULT,
                 attempts_max: int = SEND_ATTEMPTS_MAX_DEFAULT, deadline_s: float = SEND_DEADLINE_S_DEFAULT,
                 backoff: Backoff | None = None, sealing_wait_s: float = SEALING_WAIT_S_MAX,
                 wire_format: str = WIRE_FORMAT_DEFAULT):
        assert attempts_max >= 1 and send_timeout_s > 0 and deadline_s > 0
        self.topic = topic
        self.wire_format = check_wire_format(wire_format)
        self.token = token
        self.selector = as_selector(selector)
        if isinstance(fault_avoidance, LatencyFaultAvoidance):
            self.fault = fault_avoidance
        else:
            self.fault = LatencyFaultAvoidance(enabled=bool(fault_avoidance))
        self._take_routes(meta_urls, token, routes, route_mode, session, ssl_context)
        self.send_timeout_s = send_timeout_s
        self.attempts_max = attempts_max
        self.deadline_s = deadline_s
        self.backoff = backoff or Backoff()
        self.sealing_wait_s = sealing_wait_s
        self._closed = False
        self.producer_id = secrets.randbits(63)                     # X-Producer-Id
        self._seqs: dict[int, itertools.count] = {}                 # queue -> its next batch number

    def _next_seq(self, q: int) -> int:
        return next(self._seqs.setdefault(q, itertools.count()))

    # -- sending -----------------------------------------------------------------------------------------------
    async def send(self, body: str | bytes, key: str | None = None, props: Mapping[str, str] | None = None, *,
                   queue: int | None = None) -> SendResult:
        """Send one message. ``key`` keeps per-key order (same key, same queue); ``queue`` forces a queue."""
        return await self.send_batch([Message(body, key, props)], queue=queue)

    async def send_batch(self, messages: Iterable[Message | Mapping[str, Any] | str | bytes], *,
                         queue: int | None = None) -> SendResult:
        """Send messages to one queue in one request (all stored or none). Without ``queue`` the first message
        decides; keyed messages of one batch must all belong to that queue."""
        msgs = [as_message(m) for m in messages]
        if not msgs or len(msgs) > BATCH_MESSAGES_MAX:
            raise ValueError(f"a batch has 1-{BATCH_MESSAGES_MAX} messages")
        payload = send_body(msgs, self.wire_format)
        deadline = Deadline(self.deadline_s)
        route = await self._route(deadline)
        q, movable = self._first_choice(route, msgs, queue)
        failed_broker: str | None = None
        last: StatorError | None = None
        seqs: dict[int, int] = {}   # this batch's number on each queue it was sent to: a resend keeps it
        for attempt in range(self.attempts_max):
            if deadline.expired:
                break
            route = await self._route(deadline)
            if movable:
                q = self.fault.pick(route["queues"], q, avoid_broker=failed_broker)
            else:
                q = self._keyed_choice(route, msgs, q, queue)
                if not _writable(route, q):
                    route = await self._wait_writable(q, min(self.sealing_wait_s, deadline.left_s()), deadline)
                    q = self._keyed_choice(route, msgs, q, queue)
            entry = _queue_entry(route, q)
            failed_broker = None
            try:
                if q not in seqs:
                    seqs[q] = self._next_seq(q)
                return await self._send_once(entry, q, payload, deadline, attempt + 1, route["version"], seqs[q])
            except StatorError as e:
                last = e
                if not await self._after_failure(e, entry, q, deadline):
                    raise
                if e.status == 0 or (e.status >= 500 and not isinstance(e, Sealing)):
                    failed_broker = entry.get("broker")
                # A refusal that already brought a newer route (a remap's NOT_LEADER, the end of a SEALING) is
                # answered: the next attempt goes to where the route now points, at once. A pause here would only
                # lengthen every remap's write pause for real producers.
                if isinstance(e, (NotLeader, Sealing)) and self.routes.version(self.topic) > route["version"]:
                    continue
            if not await self._pause_before_retry(attempt, deadline):
                break
        if last is None:
            raise Unavailable(f"send to {self.topic!r}: no attempt within {self.deadline_s} s")
        raise last

    def _first_choice(self, route: Route, msgs: list[Message], queue: int | None) -> tuple[int, bool]:
        """(queue, whether later attempts may move the batch to another queue)."""
        strict = route.get("order") == "strict"
        if queue is not None:
            _queue_entry(route, queue)
            return queue, False
        first = msgs[0]
        q = self.selector.select(route, first)
        if isinstance(self.selector, KeySelector):
            other = {self.selector.select(route, m) for m in msgs[1:] if m.key is not None}
            if other - {q} or (first.key is None and other):
                raise ValueError("keyed messages of one batch must all map to one queue; split the batch by queue")
        pinned = self.selector.pins(first)
        if not pinned:
            q = self.fault.pick(route["queues"], q)
        return q, not (pinned or strict)

    def _keyed_choice(self, route: Route, msgs: list[Message], q: int, queue: int | None) -> int:
        """A keyed message's queue by this route's slot table: a growth may have moved the key to a new queue, and
        the send carries this route's version, which the broker checks against its slot table."""
        if queue is None and self.selector.pins(msgs[0]):
            return self.selector.select(route, msgs[0])
        return q

    async def _send_once(self, entry: Mapping[str, Any], q: int, payload: Outgoing, deadline: Deadline,
                         attempts: int, route_version: int, seq: int) -> SendResult:
        address, broker = entry.get("address"), entry.get("broker")
        if not address:
            raise Unavailable(f"queue {q} of {self.topic!r}: broker {broker!r} has no address in the route")
        url = f"{address.rstrip('/')}/v1/messages/{quote(self.topic, safe='')}/{q}"
        loop = asyncio.get_running_loop()
        started = loop.time()
        # The route version the queue was chosen with: a broker whose slot table is newer refuses keyed messages
        # (NOT_LEADER), and the retry chooses again with the fresh route (per-key order across a growth).
        answer = await request(self.session(), "POST", url, token=self.token, body=payload,
                               headers={"X-Route-Version": str(route_version),
                                        "X-Producer-Id": str(self.producer_id), "X-Producer-Seq": str(seq)},
                               timeout_s=max(0.001, min(self.send_timeout_s, deadline.left_s())))
        self.fault.update(broker, (loop.time() - started) * 1000.0)
        body = answer.body if isinstance(answer.body, dict) else {}
        return SendResult(self.topic, body.get("queue", q), list(body.get("offsets", [])), broker, attempts)

    async def _after_failure(self, e: StatorError, entry: Mapping[str, Any], q: int, deadline: Deadline) -> bool:
        """Act on a failed attempt; False when the error is final (raise it)."""
        broker = entry.get("broker")
        if isinstance(e, NotLeader):
            await self._refresh(e.route_version, deadline)
        elif isinstance(e, Sealing):
            await self._wait_changed(min(self.sealing_wait_s, deadline.left_s()))
        elif isinstance(e, Fenced) or e.status == 0 or e.status >= 500:
            self.fault.update(broker, 0, failed=True)
            await self._refresh(e.route_version, deadline)
        elif isinstance(e, TopicNotFound):
            await self._refresh(None, deadline)  # raises TopicNotFound when meta agrees it is gone
        else:
            return False
        log.info("send_retry", extra={"topic": self.topic, "queue": q, "broker": broker, "code": e.code})
        return True

    async def _wait_writable(self, q: int, timeout_s: float, deadline: Deadline) -> Route:
        try:
            return await self.routes.wait_for(self.topic, lambda r: _writable(r, q), timeout_s)
        except TimeoutError:
            return await self._route(deadline)

    async def _wait_changed(self, timeout_s: float) -> None:
        """Wait (bounded) for the next route: a sealing queue's route changes when its new segment opens."""
        held = self.routes.version(self.topic)
        try:
            await self.routes.wait_for(self.topic, lambda r: r["version"] > held, timeout_s)
        except TimeoutError:
            pass


def _queue_entry(route: Route, q: int) -> Mapping[str, Any]:
    queues = route["queues"]
    if not 0 <= q < len(queues):
        raise ValueError(f"queue {q} does not exist; topic {route['topic']!r} has {len(queues)} queues")
    entry = queues[q]
    assert entry["queue"] == q, "route queues are listed in queue order"
    return entry


def _writable(route: Route, q: int) -> bool:
    queues = route["queues"]
    return 0 <= q < len(queues) and bool(queues[q].get("writable")) and bool(queues[q].get("address"))
