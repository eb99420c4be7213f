"""``PopConsumer``: shared consumption of a topic with pop (API.md pop rows): any number of consumers of one group
share every queue; the broker hands each message to one of them and hides it for ``invisible_ms``.

One popper per broker holding queue heads (taken from the route, so a remap moves the poppers) long-polls
``POST /v1/pop/{topic}``; each message runs ``handler(message)`` with at most ``concurrency`` handlers at once.
- The handler returns: the message is acked (acks are batched per broker, every ACK_FLUSH_S or ACK_BATCH_MAX).
- The handler runs long: before the invisible time ends, the time is extended (``POST /v1/invisible``, a new
  handle each time), so a slow handler does not get its message delivered to someone else meanwhile.
- The handler raises: a nack: the invisible time is set to a backoff growing with the attempt, so the message
  comes back (with ``attempt`` + 1) after it, or goes to the group's dead-letter queue after ``max_attempts``.
Acks and nacks go to the broker that popped the message (handles are that broker's). With ``order=True`` the broker
hands out one batch per queue at a time, and this consumer handles each queue's batch in offset order. Pops answer
binary batches by default (``wire_format="json"`` for JSON; client/formats.py).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import quote

import aiohttp

from .background import BackgroundTasks, InBackground
from wire.errors import Closed, StatorError, TopicNotFound
from wire.caller import Backoff, new_session, request_once
from wire.waits import wait_set
from .formats import (WIRE_FORMAT_DEFAULT, Body, Delivered, Outgoing, accept_headers, check_wire_format, popped,
                      request)
from .lifecycle import TopicClient
from .routes import RouteSubscription

log = logging.getLogger("stator.client.pop")

POP_MAX_DEFAULT = 32
INVISIBLE_MS_DEFAULT = 60_000
INVISIBLE_MS_MIN = 1_000                # the broker's bound (broker/pop/limits.py)
WAIT_MS_DEFAULT = 5_000
CONCURRENCY_DEFAULT = 16
ACK_FLUSH_S = 0.01
ACK_BATCH_MAX = 500                     # within the broker's 1,000 handles per ack
REQUEST_MARGIN_S = 5.0                  # a long poll's request timeout: its wait plus this
ROUTE_CHECK_S = 1.0                     # how often the poppers are matched against the route's heads
CLOSE_HANDLERS_S = 30.0                 # how long close() lets running handlers finish
EXTEND_AT = 0.6                         # extend the invisible time once this share of it has passed


@dataclass(frozen=True)
class PoppedMessage(Body):
    """One popped message. ``body`` is the bytes sent (a ``str`` was sent as its UTF-8 bytes; ``text`` decodes it);
    ``is_text``: it was sent as text."""
    topic: str
    queue: int
    offset: int
    body: bytes
    attempt: int
    handle: str
    broker: str                         # the address that popped it: acks go there
    key: str | None = None
    props: Mapping[str, str] = field(default_factory=dict)
    is_text: bool = False


Handler = Callable[[PoppedMessage], Awaitable[None]]


def _decode(topic: str, broker: str, d: Delivered) -> PoppedMessage:
    return PoppedMessage(topic, d.queue, d.offset, d.body, d.attempt, d.handle, broker, d.key, d.props, d.text)


class PopConsumer(InBackground, TopicClient):
    _kind = "pop consumer"

    def __init__(self, meta_urls: Sequence[str] | str, token: str, topic: str, group: str, handler: Handler, *,
                 routes: RouteSubscription | None = None, route_mode: str = "sse",
                 session: aiohttp.ClientSession | None = None, ssl_context: ssl.SSLContext | None = None,
                 max_messages: int = POP_MAX_DEFAULT,
                 invisible_ms: int = INVISIBLE_MS_DEFAULT, wait_ms: int = WAIT_MS_DEFAULT,
                 concurrency: int = CONCURRENCY_DEFAULT, order: bool = False,
                 nack_backoff: Backoff | None = None, error_backoff: Backoff | None = None,
                 wire_format: str = WIRE_FORMAT_DEFAULT):
        if not INVISIBLE_MS_MIN <= invisible_ms:
            raise ValueError(f"invisible_ms must be at least {INVISIBLE_MS_MIN}")
        if not 1 <= max_messages <= 1000 or not 1 <= concurrency or not 0 <= wait_ms <= 30_000:
            raise ValueError("max_messages must be 1-1000, concurrency >= 1, wait_ms 0-30000")
        self.topic = topic
        self.group = group
        self.token = token
        self.handler = handler
        self.wire_format = check_wire_format(wire_format)
        self._take_routes(meta_urls, token, routes, route_mode, session, ssl_context)
        self.max_messages = max_messages
        self.invisible_ms = invisible_ms
        self.wait_ms = wait_ms
        self.order = order
        self.deadline_s = wait_ms / 1000 + REQUEST_MARGIN_S
        self.nack_backoff = nack_backoff or Backoff(1.0, 60.0)
        self.error_backoff = error_backoff or Backoff(0.1, 2.0)
        self._gate = asyncio.Semaphore(concurrency)
        self._poppers: dict[str, asyncio.Task] = {}
        self._acks: dict[str, list[tuple[str, asyncio.Future]]] = {}
        self._ack_wake = asyncio.Event()
        self._background = BackgroundTasks(log, "pop_consumer_task_failed", topic=topic, group=group)
        self.handled = 0
        self.nacked = 0
        self.ack_refused = 0
        self._closed = False

    # -- lifecycle -----------------------------------------------------------------------------------------------
    async def run(self) -> None:
        """Pop and handle until ``close()``; raises what stopped it otherwise (a refused pop, e.g. 401 or 404)."""
        await self.start()
        self._spawn(self._supervise(), "pop-supervisor")
        self._spawn(self._ack_loop(), "pop-acks")
        await self._background.done.wait()
        if self.failure is not None:
            await self.close()
            raise self.failure

    async def close(self) -> None:
        """Stop popping, let running handlers finish their acks, then close."""
        if self._closed:
            return
        for t in list(self._poppers.values()):
            t.cancel()
        await asyncio.gather(*self._poppers.values(), return_exceptions=True)
        handlers = [t for t in self._background if t.get_name().startswith("pop-handle")]
        if handlers:
            # Handlers still running are given a while to finish (and ack); past it they are cancelled, and their
            # messages come back after their invisible time.
            _, late = await asyncio.wait(handlers, timeout=CLOSE_HANDLERS_S)
            for t in late:
                t.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        await self._flush_acks()
        await self._background.cancel_all()
        self._background.done.set()
        await super().close()

    # -- popping -------------------------------------------------------------------------------------------------
    async def _supervise(self) -> None:
        """One popper per broker that holds heads of the topic; a remap starts and stops poppers."""
        while True:
            route = self.routes.route(self.topic) or await self.routes.get(self.topic)
            heads = {q["address"].rstrip("/") for q in route["queues"] if q.get("address")}
            for address in heads - set(self._poppers):
                self._poppers[address] = self._spawn(self._pop_loop(address), f"popper {address}")
            for address in set(self._poppers) - heads:
                self._poppers.pop(address).cancel()
            await asyncio.sleep(ROUTE_CHECK_S)

    async def _pop_loop(self, address: str) -> None:
        failures = 0
        path = f"{address}/v1/pop/{quote(self.topic, safe='')}"
        while True:
            await self._gate.acquire()          # room for at least one handler before asking for more
            self._gate.release()
            try:
                answer = await request(self.session(), "POST", path, token=self.token, timeout_s=self.deadline_s,
                                       body=Outgoing(json={"group": self.group, "max": self.max_messages,
                                                           "order": self.order, "invisible_ms": self.invisible_ms,
                                                           "wait_ms": self.wait_ms}),
                                       headers=accept_headers(self.wire_format))
                deliveries = popped(answer)
                failures = 0
            except StatorError as e:
                if e.status in (400, 401, 403) or isinstance(e, TopicNotFound):
                    raise
                failures += 1
                log.info("pop_failed", extra={"broker": address, "error": repr(e)})
                await asyncio.sleep(self.error_backoff.delay_s(failures))
                continue
            messages = [_decode(self.topic, address, d) for d in deliveries]
            if self.order:
                by_queue: dict[int, list[PoppedMessage]] = {}
                for m in sorted(messages, key=lambda m: m.offset):
                    by_queue.setdefault(m.queue, []).append(m)
                for batch in by_queue.values():
                    await self._gate.acquire()
                    self._spawn(self._handle_in_order(batch), f"pop-handle {address}")
            else:
                for m in messages:
                    await self._gate.acquire()
                    self._spawn(self._handle_one(m), f"pop-handle {address}")

    # -- handling ------------------------------------------------------------------------------------------------
    async def _handle_one(self, m: PoppedMessage) -> None:
        try:
            await self._handle(m)
        finally:
            self._gate.release()

    async def _handle_in_order(self, batch: list[PoppedMessage]) -> None:
        try:
            for m in batch:
                if not await self._handle(m):
                    return   # a failed message comes back first; the rest of the batch comes back with it
        finally:
            self._gate.release()

    async def _handle(self, m: PoppedMessage) -> bool:
        """Run the handler, extending the invisible time while it runs; ack on success, nack on failure."""
        current = [m.handle]
        keeper = asyncio.create_task(self._keep_invisible(m, current))
        try:
            await self.handler(m)
            ok = True
        except asyncio.CancelledError:
            raise
        except Exception as e:
            ok = False
            log.warning("pop_handler_failed", extra={"topic": self.topic, "queue": m.queue, "offset": m.offset,
                                                     "attempt": m.attempt, "error": repr(e)})
        finally:
            keeper.cancel()
            await asyncio.gather(keeper, return_exceptions=True)
        if ok:
            self.handled += 1
            await self._ack(m.broker, current[0])
        else:
            self.nacked += 1
            await self._nack(m, current[0])
        return ok

    async def _keep_invisible(self, m: PoppedMessage, current: list[str]) -> None:
        while True:
            await asyncio.sleep(self.invisible_ms / 1000 * EXTEND_AT)
            try:
                current[0] = await self._change_invisible(m.broker, current[0], self.invisible_ms)
            except StatorError as e:
                log.warning("pop_extend_failed", extra={"queue": m.queue, "offset": m.offset, "error": repr(e)})
                if e.status in (400, 409):
                    return   # no longer ours: it will be delivered again

    async def _nack(self, m: PoppedMessage, handle: str) -> None:
        """Hide the message for a backoff growing with its attempt: it comes back after it (attempt + 1)."""
        delay_ms = max(INVISIBLE_MS_MIN, int(self.nack_backoff.delay_s(m.attempt - 1) * 1000))
        try:
            await self._change_invisible(m.broker, handle, delay_ms)
        except StatorError as e:   # it comes back at its invisible time anyway
            log.info("pop_nack_failed", extra={"queue": m.queue, "offset": m.offset, "error": repr(e)})

    async def _change_invisible(self, broker: str, handle: str, invisible_ms: int) -> str:
        answer = await request_once(self.session(), "POST", f"{broker}/v1/invisible", token=self.token,
                                    json={"group": self.group, "handle": handle, "invisible_ms": invisible_ms},
                                    timeout_s=REQUEST_MARGIN_S * 2)
        return answer.body["handle"]

    # -- acks, batched per broker --------------------------------------------------------------------------------
    async def _ack(self, broker: str, handle: str) -> None:
        future = asyncio.get_running_loop().create_future()
        pending = self._acks.setdefault(broker, [])
        pending.append((handle, future))
        if len(pending) >= ACK_BATCH_MAX:
            self._ack_wake.set()
        await future

    async def _ack_loop(self) -> None:
        while True:
            await wait_set(self._ack_wake, ACK_FLUSH_S)
            self._ack_wake.clear()
            await self._flush_acks()

    async def _flush_acks(self) -> None:
        batches, self._acks = self._acks, {}
        await asyncio.gather(*(self._send_acks(b, items) for b, items in batches.items()))

    async def _send_acks(self, broker: str, items: list[tuple[str, asyncio.Future]]) -> None:
        for i in range(0, len(items), ACK_BATCH_MAX):
            chunk = items[i:i + ACK_BATCH_MAX]
            try:
                answer = await request_once(self.session(), "POST", f"{broker}/v1/ack", token=self.token,
                                            json={"group": self.group, "handles": [h for h, _ in chunk]},
                                            timeout_s=REQUEST_MARGIN_S * 2)
                for r in answer.body["results"]:
                    if not r.get("ok"):
                        self.ack_refused += 1   # superseded: the message was (or will be) delivered again
                        log.info("pop_ack_refused", extra={"code": r.get("code")})
            except (StatorError, Closed) as e:
                log.warning("pop_ack_failed", extra={"broker": broker, "error": repr(e)})
            for _, f in chunk:
                if not f.done():
                    f.set_result(None)

    def session(self) -> aiohttp.ClientSession:
        self._check_open()
        if self._session is None:
            self._session = new_session(self._ssl_context)
        return self._session
