"""``ExclusiveConsumer``: ordered consumption of one topic in an exclusive group (DESIGN.md invariants 6 and 7).

Meta grants each queue of the topic to one member of the group at a time, as a lease with a fencing token; the
brokers refuse pulls and commits that carry a superseded token. This consumer:

- heartbeats to meta (``POST /v1/groups/{group}/heartbeat``, failing over across meta nodes) every
  ``heartbeat_interval_ms`` of the latest answer. Every queue in an answer is held until the monotonic time the
  heartbeat was SENT + ``lease_ms`` - a safety margin (meta counts from when it received it, later; a deposed leader
  may stretch a lease by about a second, hence a margin of at least one second);
- runs one worker per held queue: from the group's committed offset (the queue's oldest offset if it never
  committed), pulls with the token, hands each message to ``await handler(message)`` only while the lease holds by
  the local clock (checked before each message), and commits the position with the token after each batch;
- on a queue missing from an answer (revoked): stops its worker, commits its position with the old token (the broker
  still accepts it until the release), and heartbeats at once with the queue in ``released``;
  on a new token for a queue (the old grant is gone): stops the worker without committing and starts over from the
  committed offset with the new token; on a lease that ran out locally: stops processing and committing, and keeps
  heartbeating to get the queues back;
- order strategy (the topic route's ``order`` unless given): ``strict`` retries a failing message in place, with
  backoff, blocking its queue and never skipping it; ``best_tried`` sends it to the group's retry topic (config
  ``retry_topic``) with props ``origin_topic``, ``origin_queue``, ``origin_offset`` and ``attempt``, and moves on; if
  that send fails, the message is retried in place (never lost).

Delivery is at least once: a message handled but not yet committed when the queue moves is handled again by its next
owner. ``close()`` stops the workers, commits their positions, and leaves the group (its queues move at once).
A handler exception never stops the consumer; an unexpected exception of a background task (or a refusal of meta that
another try cannot change, such as 409 ``GROUP_MODE_MISMATCH``) is logged and raised from ``run()`` and ``close()``.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import re
import secrets
import socket
import ssl
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import aiohttp

from .background import BackgroundTasks, InBackground
from .consumer import IDLE_PAUSE_S, PULL_MESSAGES_MAX_DEFAULT, PullConsumer, PullResult, ReceivedMessage
from wire.errors import Closed, NotLeader, StaleToken, StatorError, TopicNotFound
from wire.caller import Backoff, MetaCaller, new_session
from wire.waits import wait_set
from .lifecycle import StartedByWith, lone_tls
from .formats import WIRE_FORMAT_DEFAULT, check_wire_format
from .producer import Producer

log = logging.getLogger("stator.client.exclusive")

Handler = Callable[[ReceivedMessage], Awaitable[Any]]

ORDERS = ("strict", "best_tried")
MEMBER_CHARS_MAX = 128
LEASE_MARGIN_S_MIN = 1.0              # covers a deposed meta leader stretching a lease (meta/group_sessions.py)
LEASE_MARGIN_FRACTION = 0.10
LEASE_MARGIN_FRACTION_MAX = 0.5       # the margin never eats more than half a lease (the shortest lease is 1 s)
HEARTBEAT_DEADLINE_S_MIN = 5.0        # a joining heartbeat waits for its command to commit
HANDLER_TIMEOUT_S_DEFAULT = 60.0      # a handler running longer counts as a failure of that message
STOP_GRACE_S_DEFAULT = 5.0            # a stopping worker may finish its message this long before it is cancelled
LEAVE_DEADLINE_S = 5.0
HANDLER_BACKOFF_BASE_S = 0.1          # pauses between retries of a failing message grow from here...
HANDLER_BACKOFF_CAP_S = 5.0           # ...up to here
ERROR_BACKOFF_BASE_S = 0.1            # pauses after a failed pull or commit
ERROR_BACKOFF_CAP_S = 2.0


def default_member() -> str:
    """host-pid-random, within the member name rules (1-128 of A-Za-z0-9_-)."""
    host = re.sub(r"[^A-Za-z0-9_-]", "-", socket.gethostname()) or "host"
    tail = f"-{os.getpid()}-{secrets.token_hex(4)}"
    return host[:MEMBER_CHARS_MAX - len(tail)] + tail


def lease_margin_s(lease_s: float, wanted_s: float | None) -> float:
    """The safety margin: ``wanted_s``, by default max(1 s, 10 % of the lease); at most half of the lease."""
    margin = wanted_s if wanted_s is not None else max(LEASE_MARGIN_S_MIN, LEASE_MARGIN_FRACTION * lease_s)
    return min(margin, LEASE_MARGIN_FRACTION_MAX * lease_s)


def retry_props(m: ReceivedMessage, failures: int) -> dict[str, str]:
    """Props of ``m`` as sent to the retry topic. A message read from a retry topic keeps its first origin, and its
    attempts add up."""
    props = dict(m.props)
    earlier = 0
    if "origin_topic" in props:
        try:
            earlier = int(props.get("attempt", "0"))
        except ValueError:
            earlier = 0
    else:
        props.update(origin_topic=m.topic, origin_queue=str(m.queue), origin_offset=str(m.offset))
    props["attempt"] = str(earlier + failures)
    return props


def _transient(e: StatorError) -> bool:
    """A failure another try may not see: no answer, 5xx (LOCKS_CATCHING_UP, SEALING, ...), a route moving."""
    return e.status == 0 or e.status >= 500 or isinstance(e, (NotLeader, TopicNotFound))


@dataclass(eq=False)
class _Lease:
    """One held queue: its token, until when it holds by the local clock, and its worker."""
    queue: int
    token: int
    valid_until: float
    position: int | None = None     # the next offset to handle
    committed: int | None = None    # the last offset committed (or read as committed) under this token
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task | None = None


class ExclusiveConsumer(InBackground, StartedByWith):
    """Consumes ``topic`` for the exclusive ``group`` with ``handler`` (an async function of one
    ``ReceivedMessage``). ``run()`` runs until ``close()``; or ``start()`` then ``close()``; or ``async with``.
    ``wire_format``: how it pulls and sends to the retry topic, ``"binary"`` (the default) or ``"json"``."""

    def __init__(self, meta_urls: Sequence[str] | str, token: str, topic: str, group: str, handler: Handler, *,
                 member: str | None = None, order: str | None = None, lease_margin_s: float | None = None,
                 max_messages: int = PULL_MESSAGES_MAX_DEFAULT,
                 handler_timeout_s: float | None = HANDLER_TIMEOUT_S_DEFAULT,
                 stop_grace_s: float = STOP_GRACE_S_DEFAULT, idle_pause_s: float = IDLE_PAUSE_S,
                 handler_backoff: Backoff | None = None, error_backoff: Backoff | None = None,
                 route_mode: str = "sse", session: aiohttp.ClientSession | None = None,
                 ssl_context: ssl.SSLContext | None = None, wire_format: str = WIRE_FORMAT_DEFAULT):
        if order is not None and order not in ORDERS:
            raise ValueError(f"order must be one of {ORDERS}")
        self.member = member if member is not None else default_member()
        if not re.fullmatch(rf"[A-Za-z0-9_-]{{1,{MEMBER_CHARS_MAX}}}", self.member):
            raise ValueError(f"member must be 1-{MEMBER_CHARS_MAX} characters of A-Za-z0-9_-")
        if lease_margin_s is not None and lease_margin_s < 0:
            raise ValueError("lease_margin_s must be >= 0")
        if handler_timeout_s is not None and handler_timeout_s <= 0:
            raise ValueError("handler_timeout_s must be > 0 (or None for no limit)")
        self._meta_urls = meta_urls
        self._token = token
        self.topic = topic
        self.group = group
        self.handler = handler
        self.order = order
        self.lease_margin_s = lease_margin_s
        self.max_messages = max_messages
        self.handler_timeout_s = handler_timeout_s
        self.stop_grace_s = stop_grace_s
        self.idle_pause_s = idle_pause_s
        self.handler_backoff = handler_backoff or Backoff(HANDLER_BACKOFF_BASE_S, HANDLER_BACKOFF_CAP_S)
        self.error_backoff = error_backoff or Backoff(ERROR_BACKOFF_BASE_S, ERROR_BACKOFF_CAP_S)
        self._route_mode = route_mode
        self.wire_format = check_wire_format(wire_format)
        self._ssl_context = lone_tls(session, ssl_context)
        self._session = session
        self._owns_session = session is None
        self._meta: MetaCaller | None = None
        self._consumer: PullConsumer | None = None
        self._producer: Producer | None = None
        self._path = f"/v1/groups/{quote(group, safe='')}"
        # From meta's latest answer.
        self.config: dict[str, Any] = {}
        self._interval_s = 0.0
        self._lease_s = 0.0
        # Queue state. A queue is in at most one of _leases (working) and _retiring (worker stopping).
        self._leases: dict[int, _Lease] = {}
        self._retiring: dict[int, asyncio.Task] = {}
        self._given_up: dict[int, int] = {}        # queue -> a token released or found stale: never used again
        self._released: list[dict[str, Any]] = []  # to send with the next heartbeat
        self._beat_now = asyncio.Event()
        self._heartbeat_task: asyncio.Task | None = None
        self._background = BackgroundTasks(log, "exclusive_consumer_task_failed", group=group, member=self.member)
        self.heartbeats_failed = 0
        self._started = False
        self._closing = False
        self._closed = False

    # -- what it holds -----------------------------------------------------------------------------------------
    def held(self) -> dict[int, int]:
        """Queue -> token of every queue being worked on now."""
        return {q: lease.token for q, lease in sorted(self._leases.items())}

    def positions(self) -> dict[int, int]:
        """Queue -> next offset to handle, of every queue being worked on now."""
        return {q: lease.position for q, lease in sorted(self._leases.items()) if lease.position is not None}

    # -- lifecycle ---------------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Join the group (the first heartbeat; raises what meta refuses) and start heartbeating and working."""
        if self._closing:
            raise Closed("this consumer is closed")
        if self._started:
            return
        self._started = True
        if self._session is None:
            self._session = new_session(self._ssl_context)
        self._meta = MetaCaller(self._meta_urls, self._token, session=self._session)
        self._consumer = PullConsumer(self._meta_urls, self._token, self.topic, self.group,
                                      route_mode=self._route_mode, session=self._session,
                                      max_messages=self.max_messages, idle_pause_s=self.idle_pause_s,
                                      wire_format=self.wire_format)
        await self._beat(raise_transient=True)
        self._heartbeat_task = self._background.spawn(self._heartbeat_loop(), f"group-heartbeat-{self.group}")

    async def run(self) -> None:
        """Start, then run until ``close()``; raises the failure of a background task (after closing)."""
        try:
            await self.start()
        except BaseException:
            await self.close()
            raise
        await self._background.done.wait()
        if not self._closing:
            await self.close()  # a background task failed: clean up, then raise its failure
        elif self.failure is not None:
            raise self.failure

    async def close(self) -> None:
        """Stop heartbeating and the workers, commit every position, leave the group. Raises the failure of a
        background task, if one failed."""
        if self._closing:
            if self.failure is not None:
                raise self.failure
            return
        self._closing = True
        try:
            if self._heartbeat_task is not None:
                self._heartbeat_task.cancel()
                await asyncio.gather(self._heartbeat_task, return_exceptions=True)
            leases = list(self._leases.values())
            self._leases.clear()
            await asyncio.gather(*(self._stop(lease) for lease in leases))
            await asyncio.gather(*self._retiring.values(), return_exceptions=True)
            for lease in leases:
                await self._commit_final(lease)
            if self._started:
                await self._leave()
        finally:
            await self._close_parts()
            self._closed = True
            self._background.done.set()
        if self.failure is not None:
            raise self.failure

    async def _leave(self) -> None:
        assert self._meta is not None
        try:
            await self._meta.call("POST", self._path + "/leave", json={"member": self.member},
                                  deadline_s=LEAVE_DEADLINE_S)
        except StatorError as e:  # the lease ends by itself: the queues move when it does
            log.warning("group_leave_failed", extra={"group": self.group, "member": self.member, "error": repr(e)})

    async def _close_parts(self) -> None:
        await self._background.cancel_all()
        for part in (self._producer, self._consumer, self._meta):
            if part is not None:
                await part.close()
        if self._owns_session and self._session is not None:
            await self._session.close()

    # -- heartbeats --------------------------------------------------------------------------------------------
    async def _heartbeat_loop(self) -> None:
        while True:
            await wait_set(self._beat_now, self._interval_s)
            await self._beat(raise_transient=False)

    async def _beat(self, *, raise_transient: bool) -> None:
        """One heartbeat, with the releases due. Raises a refusal that no retry changes (4xx); a transient failure
        only when ``raise_transient`` (the first one, from ``start``): later, the leases simply run out."""
        assert self._meta is not None
        self._beat_now.clear()
        released = list(self._released)
        body: dict[str, Any] = {"member": self.member, "topics": [self.topic], "mode": "exclusive"}
        if released:
            body["released"] = released
        sent = asyncio.get_running_loop().time()
        try:
            answer = await self._meta.call("POST", self._path + "/heartbeat", json=body,
                                           deadline_s=max(self._lease_s, HEARTBEAT_DEADLINE_S_MIN))
        except StatorError as e:
            if raise_transient or not _transient(e):
                raise
            self.heartbeats_failed += 1
            log.warning("group_heartbeat_failed", extra={"group": self.group, "member": self.member,
                                                         "error": repr(e)})
            return
        self._released = [r for r in self._released if r not in released]
        self._apply(answer.body, sent)

    def _apply(self, answer: dict[str, Any], sent: float) -> None:
        """Act on a heartbeat answer sent at loop time ``sent``: renew, revoke, replace and start queues."""
        self.config = dict(answer.get("config") or {})
        self._interval_s = answer["heartbeat_interval_ms"] / 1000
        self._lease_s = answer["lease_ms"] / 1000
        valid_until = sent + self._lease_s - lease_margin_s(self._lease_s, self.lease_margin_s)
        granted = {int(a["queue"]): int(a["token"]) for a in answer["assignments"] if a["topic"] == self.topic}
        for q, lease in list(self._leases.items()):
            token = granted.get(q)
            if token == lease.token:
                lease.valid_until = valid_until
            else:  # revoked (None), or granted anew: the old grant is gone
                self._retire(lease, release=token is None)
        for q, token in sorted(granted.items()):
            if q in self._leases or q in self._retiring or self._given_up.get(q) == token:
                continue
            self._given_up.pop(q, None)
            lease = _Lease(q, token, valid_until)
            self._leases[q] = lease
            lease.task = self._spawn(self._work(lease), f"exclusive-{self.topic}-{q}")
        # A queue granted and revoked again between two heartbeats was never worked here: release it now, or it
        # waits out a whole lease before its new owner gets it. (A worked one is released by its retiring task.)
        for r in answer.get("revoking", []):
            q, token = int(r["queue"]), int(r["token"])
            ref = {"topic": self.topic, "queue": q, "token": token}
            if r["topic"] == self.topic and q not in self._leases and q not in self._retiring \
                    and ref not in self._released:
                self._given_up[q] = token
                self._released.append(ref)
                self._beat_now.set()

    def _retire(self, lease: _Lease, *, release: bool) -> None:
        del self._leases[lease.queue]
        self._retiring[lease.queue] = self._spawn(self._retire_task(lease, release), f"retire-{lease.queue}")

    async def _retire_task(self, lease: _Lease, release: bool) -> None:
        """Stop the worker; for a revoked queue, commit with the old token and release it; then heartbeat at once
        (a replaced queue restarts with the new token from that answer)."""
        try:
            await self._stop(lease)
            if release:
                await self._commit_final(lease)
                self._given_up[lease.queue] = lease.token
                self._released.append({"topic": self.topic, "queue": lease.queue, "token": lease.token})
        finally:
            self._retiring.pop(lease.queue, None)
            self._beat_now.set()

    async def _stop(self, lease: _Lease) -> None:
        """Ask the worker to stop after its current message; cancel it if it has not within ``stop_grace_s``."""
        lease.stop.set()
        task = lease.task
        if task is None or task.done():
            return
        _, pending = await asyncio.wait({task}, timeout=self.stop_grace_s)
        if pending:
            task.cancel()
            await asyncio.wait({task}, timeout=self.stop_grace_s)

    async def _commit_final(self, lease: _Lease) -> None:
        """Commit a stopped worker's position with its token, while the lease holds; a failure loses no message
        (the next owner handles it again)."""
        try:
            await self._commit(lease)
        except StatorError as e:
            log.warning("final_commit_failed", extra={"group": self.group, "queue": lease.queue, "error": repr(e)})

    # -- one queue's worker ------------------------------------------------------------------------------------
    def _holds(self, lease: _Lease) -> bool:
        return asyncio.get_running_loop().time() < lease.valid_until

    async def _pause(self, lease: _Lease, seconds: float) -> None:
        """Sleep up to ``seconds``; a stop request ends it early."""
        await wait_set(lease.stop, seconds)

    async def _work(self, lease: _Lease) -> None:
        failures = 0
        while not lease.stop.is_set():
            try:
                await self._round(lease)
                failures = 0
            except StaleToken:  # a newer grant exists: this token is done; the next answer tells what is ours
                log.info("lock_token_stale", extra={"group": self.group, "queue": lease.queue, "token": lease.token})
                self._given_up[lease.queue] = lease.token
                if self._leases.get(lease.queue) is lease:
                    del self._leases[lease.queue]
                self._beat_now.set()
                return
            except StatorError as e:
                if not _transient(e):
                    raise
                log.warning("exclusive_round_failed", extra={"group": self.group, "queue": lease.queue,
                                                             "error": repr(e)})
                await self._pause(lease, self.error_backoff.delay_s(failures))
                failures += 1

    async def _round(self, lease: _Lease) -> None:
        """Pull one batch, handle it while the lease holds, commit how far it got."""
        if not self._holds(lease):  # lost locally: no handling, no commit, until a heartbeat renews it
            await self._pause(lease, self._interval_s)
            return
        if lease.position is None:
            await self._start_position(lease)
        assert self._consumer is not None and lease.position is not None
        order = await self._order()
        r = await self._consumer.pull(lease.queue, offset=lease.position, lock_token=lease.token)
        if await self._handle_batch(lease, r, order):
            lease.position = max(lease.position, r.next_offset)
        await self._commit(lease)
        if not r.messages:
            await self._pause(lease, self.idle_pause_s)

    async def _start_position(self, lease: _Lease) -> None:
        """The group's committed offset, or the queue's oldest offset if the group never committed."""
        assert self._consumer is not None
        await self._route_has(lease.queue)
        committed = await self._consumer.committed(lease.queue)
        if committed >= 0:
            lease.position = lease.committed = committed
        else:
            lease.position = await self._consumer.min_offset(lease.queue, lock_token=lease.token)

    async def _route_has(self, queue: int) -> None:
        """Wait (bounded) for a route that has ``queue``: meta may grant a queue of a grown topic before this
        client's route shows it."""
        assert self._consumer is not None
        try:
            await self._consumer.routes.wait_for(self.topic, lambda r: len(r["queues"]) > queue,
                                                 max(self._interval_s, self.idle_pause_s))
        except TimeoutError:
            raise TopicNotFound(404, "TOPIC_NOT_FOUND", f"queue {queue} of {self.topic!r} is not in its route yet") \
                from None

    async def _order(self) -> str:
        if self.order is not None:
            return self.order
        assert self._consumer is not None
        route = await self._consumer.routes.get(self.topic)
        return route.get("order") or "best_tried"

    async def _handle_batch(self, lease: _Lease, r: PullResult, order: str) -> bool:
        """Handle the messages in offset order; False when it stopped before the end (stop, lease lost)."""
        for m in r.messages:
            if not await self._handle(lease, m, order):
                return False
            lease.position = m.offset + 1
        return True

    async def _handle(self, lease: _Lease, m: ReceivedMessage, order: str) -> bool:
        """Handle one message until it is done (handled, or sent to the retry topic); False when the worker must
        stop first (stop request, lease lost)."""
        failures = 0
        while True:
            if lease.stop.is_set() or not self._holds(lease):
                return False
            try:
                await self._call_handler(m)
                return True
            except Exception as e:  # the handler's failure is the message's, never the consumer's
                failures += 1
                log.warning("handler_failed", extra={"group": self.group, "queue": m.queue, "offset": m.offset,
                                                     "attempt": failures, "order": order, "error": repr(e)})
            if order == "best_tried" and await self._to_retry_topic(m, failures):
                return True
            await self._pause(lease, self.handler_backoff.delay_s(failures - 1))

    async def _call_handler(self, m: ReceivedMessage) -> None:
        result = self.handler(m)
        if inspect.isawaitable(result):
            if self.handler_timeout_s is None:
                await result
            else:
                await asyncio.wait_for(result, self.handler_timeout_s)

    async def _to_retry_topic(self, m: ReceivedMessage, failures: int) -> bool:
        """Send ``m`` to the group's retry topic; False when that failed (the caller retries in place)."""
        try:
            await self._retry_producer().send(m.sent_body, key=m.key, props=retry_props(m, failures))
            return True
        except StatorError as e:
            log.warning("retry_topic_send_failed", extra={"group": self.group, "queue": m.queue,
                                                          "offset": m.offset, "error": repr(e)})
            return False

    def _retry_producer(self) -> Producer:
        assert self._consumer is not None
        topic = self.config.get("retry_topic") or f"{self.group}-retry"
        if self._producer is None or self._producer.topic != topic:
            old, self._producer = self._producer, Producer(self._meta_urls, self._token, topic,
                                                           routes=self._consumer.routes, session=self._session,
                                                           wire_format=self.wire_format)
            if old is not None:
                self._spawn(old.close(), "retry-producer-close")
        return self._producer

    async def _commit(self, lease: _Lease) -> None:
        """Commit the position with the token, when it moved and the lease holds."""
        assert self._consumer is not None
        pos = lease.position
        if pos is None or pos == lease.committed or not self._holds(lease):
            return
        await self._consumer.commit(lease.queue, pos, lock_token=lease.token)
        lease.committed = pos
