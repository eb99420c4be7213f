"""``RouteSubscription``: the newest route of each topic a client uses, pushed by meta (SSE) or pulled (long poll).

- SSE (default): one stream ``GET /v1/watch?topics=a,b&after=V`` for every subscribed topic. ``after`` is the lowest
  version held among them, so a reconnect (to the next meta node, after an error or an idle stream) misses nothing;
  routes sent again are dropped by the version check. The server sends a keepalive comment every 15 s, so a stream
  silent for ``idle_timeout_s`` is dead and replaced.
- Long poll: per topic ``GET /v1/routes/{t}?after=V&wait=S&min_version=V``; 200 is a newer route, 304 is no change.
  ``min_version`` keeps a lagging node from answering with older state (404 from it would otherwise look like a delete).

Versions never go back: a route (or a delete) older than or equal to the one held is ignored, whichever path brought
it. ``refresh`` re-reads a route at once (a broker said ``NOT_LEADER``); concurrent refreshes of a topic share one
request. Listeners are called in the event loop on each change with ``(topic, route)``, ``route`` None on delete.
Everything runs in tasks that ``close()`` (or leaving ``async with``) cancels and awaits.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
from collections.abc import Callable, Iterable, Sequence
from typing import Any
from urllib.parse import quote

import aiohttp

from wire.errors import Closed, StatorError, TopicNotFound
from wire.caller import (META_ATTEMPTS_MAX_DEFAULT, META_DEADLINE_S_DEFAULT, REQUEST_TIMEOUT_S_DEFAULT, TRANSPORT_ERRORS,
                   Backoff, MetaCaller, auth_headers, client_timeout)
from wire import route as route_model
from wire.route import RouteError
from wire.sse import SseEvent, SseParser, SseProtocolError
from wire.waits import wait_set

log = logging.getLogger("stator.client.routes")

Route = dict[str, Any]
RouteListener = Callable[[str, "Route | None"], None]

MODES = ("sse", "long_poll")
POLL_WAIT_S_DEFAULT = 30.0
POLL_SLACK_S = 10.0                  # a long poll's timeout is its wait plus this
SSE_IDLE_TIMEOUT_S_DEFAULT = 45.0    # three of the server's 15 s keepalives
RECONNECT_BACKOFF_BASE_S = 0.05      # the pause between reconnects doubles from here...
RECONNECT_BACKOFF_CAP_S = 2.0        # ...up to here
MISSING_TOPIC_RETRY_S = 1.0          # long poll of a topic that does not exist (the server answers 404 at once)
ERROR_BODY_BYTES_MAX = 64 * 1024


def _path(topic: str) -> str:
    return "/v1/routes/" + quote(topic, safe="")


class RouteSubscription:
    def __init__(self, meta_urls: Sequence[str] | str, token: str, topics: Iterable[str] = (), mode: str = "sse", *,
                 session: aiohttp.ClientSession | None = None, poll_wait_s: float = POLL_WAIT_S_DEFAULT,
                 idle_timeout_s: float = SSE_IDLE_TIMEOUT_S_DEFAULT,
                 request_timeout_s: float = REQUEST_TIMEOUT_S_DEFAULT,
                 attempts_max: int = META_ATTEMPTS_MAX_DEFAULT, deadline_s: float = META_DEADLINE_S_DEFAULT,
                 reconnect_backoff: Backoff | None = None, ssl_context: ssl.SSLContext | None = None):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}")
        if not 0 < poll_wait_s <= 300:
            raise ValueError("poll_wait_s must be within (0, 300]")
        self.mode = mode
        self.meta = MetaCaller(meta_urls, token, session=session, timeout_s=request_timeout_s,
                               attempts_max=attempts_max, deadline_s=deadline_s, ssl_context=ssl_context)
        self.poll_wait_s = poll_wait_s
        self.idle_timeout_s = idle_timeout_s
        self.reconnect_backoff = reconnect_backoff or Backoff(RECONNECT_BACKOFF_BASE_S, RECONNECT_BACKOFF_CAP_S)
        self._topics: set[str] = set(topics)
        self._routes: dict[str, Route] = {}
        self._versions: dict[str, int] = {}   # newest version seen per topic, of a route or of a delete
        self._listeners: list[RouteListener] = []
        self._changed = asyncio.Event()       # replaced after each change; waiters re-check
        self._refreshing: dict[str, tuple[int, asyncio.Task]] = {}
        self._sse_task: asyncio.Task | None = None
        self._poll_tasks: dict[str, asyncio.Task] = {}
        self._tasks: set[asyncio.Task] = set()
        self._started = False
        self._closed = False
        self.connected_url: str | None = None  # the meta node the SSE stream is connected to now
        self.last_error: BaseException | None = None
        self.reconnects = 0

    # -- reading -----------------------------------------------------------------------------------------------
    def route(self, topic: str) -> Route | None:
        """The newest route held for ``topic``, without any I/O."""
        return self._routes.get(topic)

    def version(self, topic: str) -> int:
        """The newest version seen for ``topic`` (-1 if none)."""
        return self._versions.get(topic, -1)

    @property
    def topics(self) -> frozenset[str]:
        return frozenset(self._topics)

    async def get(self, topic: str, min_version: int | None = None) -> Route:
        """The topic's route: the held one, else fetched once (and the topic is watched from now on).

        Meta nodes apply the log at their own pace, so a topic created through one node may not exist yet on another:
        pass the version the creation returned as ``min_version`` to read from a node that has it."""
        self.subscribe(topic)
        r = self._routes.get(topic)
        if r is not None and r["version"] >= (min_version or 0):
            return r
        return await self.refresh(topic, min_version)

    async def refresh(self, topic: str, min_version: int | None = None) -> Route:
        """Re-read the route now from meta, from a node that has applied at least ``min_version`` (and at least the
        version held). Returns the newest route held afterwards. Raises ``TopicNotFound`` if the topic is gone."""
        self._check_open()
        want = max(min_version or 0, self.version(topic), 0)
        running = self._refreshing.get(topic)
        if running is None or running[0] < want:
            task = asyncio.create_task(self._fetch(topic, want), name=f"route-refresh-{topic}")
            running = (want, task)
            self._refreshing[topic] = running
            task.add_done_callback(lambda t, topic=topic: self._refresh_done(topic, t))
        await asyncio.shield(running[1])
        r = self._routes.get(topic)
        if r is None:
            raise TopicNotFound(404, "TOPIC_NOT_FOUND", f"topic {topic!r} does not exist")
        return r

    def _refresh_done(self, topic: str, task: asyncio.Task) -> None:
        if self._refreshing.get(topic, (0, None))[1] is task:
            del self._refreshing[topic]
        if not task.cancelled():
            task.exception()  # retrieved by the awaiting callers; keeps asyncio from logging it as never retrieved

    async def _fetch(self, topic: str, min_version: int) -> None:
        params = {"min_version": min_version} if min_version > 0 else {}
        try:
            answer = await self.meta.call("GET", _path(topic), params=params)
        except TopicNotFound as e:
            self._offer_deleted(topic, e.meta_version if e.meta_version is not None else min_version)
            raise
        self._offer(answer.body)

    async def wait_for(self, topic: str, predicate: Callable[[Route], bool], timeout_s: float) -> Route:
        """Wait (at most ``timeout_s``) until the topic's route satisfies ``predicate``; returns that route.
        Raises ``TimeoutError`` when it does not in time."""
        self.subscribe(topic)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            self._check_open()
            r = self._routes.get(topic)
            if r is not None and predicate(r):
                return r
            left = deadline - loop.time()
            if left <= 0:
                raise TimeoutError(f"route of {topic!r} did not reach the wanted state within {timeout_s} s "
                                   f"(held version {self.version(topic)})")
            changed = self._changed
            await wait_set(changed, left)

    # -- listeners ---------------------------------------------------------------------------------------------
    def add_listener(self, fn: RouteListener) -> Callable[[], None]:
        """Call ``fn(topic, route_or_None)`` on every accepted change; returns a function that removes it."""
        self._listeners.append(fn)

        def remove() -> None:
            if fn in self._listeners:
                self._listeners.remove(fn)
        return remove

    # -- accepting routes (the only place state changes) -------------------------------------------------------
    def _offer(self, route: Any) -> bool:
        """Hold ``route`` if it is newer than what is held for its topic. Returns whether it was taken."""
        try:
            route_model.check(route)
        except RouteError as e:
            log.warning("route_ignored_malformed", extra={"route": str(route)[:200], "error": str(e)})
            return False
        topic, v = route["topic"], route["version"]
        if v <= self.version(topic):
            return False
        self._versions[topic] = v
        self._routes[topic] = route
        self._notify(topic, route)
        return True

    def _offer_deleted(self, topic: str, version: int) -> bool:
        if version <= self.version(topic) or topic not in self._routes:
            self._versions[topic] = max(version, self.version(topic))
            return False
        self._versions[topic] = version
        del self._routes[topic]
        self._notify(topic, None)
        return True

    def _notify(self, topic: str, route: Route | None) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
        for fn in list(self._listeners):
            try:
                fn(topic, route)
            except Exception:
                log.exception("route_listener_failed")

    # -- subscribing -------------------------------------------------------------------------------------------
    def subscribe(self, topic: str) -> None:
        """Watch ``topic`` from now on (idempotent)."""
        self._check_open()
        new = topic not in self._topics
        self._topics.add(topic)
        if not self._started:
            self.start()
        elif new and self.mode == "sse":
            self._restart_sse()
        elif new:
            self._poll_tasks[topic] = self._spawn(self._poll_loop(topic), f"route-poll-{topic}")

    def unsubscribe(self, topic: str) -> None:
        if topic not in self._topics:
            return
        self._topics.discard(topic)
        if self.mode == "sse":
            self._restart_sse()
        else:
            task = self._poll_tasks.pop(topic, None)
            if task is not None:
                task.cancel()

    def start(self) -> None:
        """Start watching the topics given so far (``get``, ``wait_for`` and ``async with`` start it too)."""
        self._check_open()
        if self._started:
            return
        self._started = True
        if self.mode == "sse":
            self._restart_sse()
        else:
            for t in self._topics:
                if t not in self._poll_tasks:
                    self._poll_tasks[t] = self._spawn(self._poll_loop(t), f"route-poll-{t}")

    def _spawn(self, coro, name: str) -> asyncio.Task:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _check_open(self) -> None:
        if self._closed:
            raise Closed("this route subscription is closed")

    # -- SSE ---------------------------------------------------------------------------------------------------
    def _restart_sse(self) -> None:
        """(Re)connect with the current topic set; the old stream, if any, is cancelled."""
        if self._sse_task is not None:
            self._sse_task.cancel()
            self._sse_task = None
        if self._topics:
            self._sse_task = self._spawn(self._sse_loop(), "route-watch")

    def _after(self) -> int:
        """The lowest version held among the watched topics: everything newer than it must be (re)sent."""
        return min((self.version(t) for t in self._topics), default=-1)

    async def _sse_loop(self) -> None:
        attempt = 0
        while not self._closed:
            url = self.meta.url
            got_events = False
            try:
                got_events = await self._sse_stream(url)
                self.last_error = None
            except (StatorError, SseProtocolError, *TRANSPORT_ERRORS) as e:
                self.last_error = e
                log.info("route_watch_broke", extra={"url": url, "error": repr(e)})
            finally:
                self.connected_url = None
            self.meta.fail_over(url)  # a stream ends only when its node is gone or stopping: try the next one
            self.reconnects += 1
            attempt = 0 if got_events else attempt + 1
            await asyncio.sleep(self.reconnect_backoff.delay_s(attempt))

    async def _sse_stream(self, url: str) -> bool:
        """One stream until it ends; returns whether any event arrived. Each read waits at most idle_timeout_s."""
        params = {"topics": ",".join(sorted(self._topics))}
        after = self._after()
        if after >= 0:
            params["after"] = str(after)
        got = False
        headers = auth_headers(self.meta.token, {"Accept": "text/event-stream"})
        async with self.meta.session().get(url + "/v1/watch", params=params, headers=headers,
                                           timeout=client_timeout(None, sock_read_s=self.idle_timeout_s)) as resp:
            if resp.status != 200:
                raw = await resp.content.read(ERROR_BODY_BYTES_MAX)
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = raw.decode("utf-8", "replace")
                err = StatorError.from_response(resp.status, body, url=url)
                err.headers = resp.headers
                raise err
            self.connected_url = url
            parser = SseParser()
            async for chunk in resp.content.iter_any():
                for event in parser.feed(chunk):
                    got = True
                    self._on_event(event)
        return got

    def _on_event(self, event: SseEvent) -> None:
        try:
            data = json.loads(event.data)
        except ValueError:
            log.warning("route_event_not_json", extra={"event": event.event})
            return
        if event.event == "route":
            self._offer(data)
        elif event.event == "deleted" and isinstance(data, dict) and isinstance(data.get("topic"), str):
            v = data.get("version")
            if not isinstance(v, int) and event.id is not None and event.id.isdigit():
                v = int(event.id)
            if isinstance(v, int):
                self._offer_deleted(data["topic"], v)

    # -- long poll ---------------------------------------------------------------------------------------------
    async def _poll_loop(self, topic: str) -> None:
        attempt = 0
        while not self._closed and topic in self._topics:
            known = self.version(topic)
            params: dict[str, Any] = {"wait": self.poll_wait_s}
            if known >= 0:
                params["after"] = known
                params["min_version"] = known
            try:
                answer = await self.meta.call("GET", _path(topic), params=params, ok=(200, 304),
                                              timeout_s=self.poll_wait_s + POLL_SLACK_S, attempts_max=1,
                                              deadline_s=self.poll_wait_s + POLL_SLACK_S)
            except TopicNotFound as e:
                self._offer_deleted(topic, e.meta_version if e.meta_version is not None else known)
                await asyncio.sleep(MISSING_TOPIC_RETRY_S)
                continue
            except StatorError as e:  # MetaCaller already moved to the next node if that can help
                self.last_error = e
                attempt += 1
                await asyncio.sleep(self.reconnect_backoff.delay_s(attempt))
                continue
            attempt = 0
            self.last_error = None
            if answer.status == 200:
                self._offer(answer.body)

    # -- lifecycle ---------------------------------------------------------------------------------------------
    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        tasks = list(self._tasks) + [t for _, t in self._refreshing.values()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._changed.set()
        await self.meta.close()

    async def __aenter__(self) -> RouteSubscription:
        self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
