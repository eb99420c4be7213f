"""What a producer and a consumer share: one topic's route subscription and an HTTP session, owned or lent,
opened on ``start`` (or entry) and closed once."""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Sequence

import aiohttp

from wire.errors import Closed, StatorError, TopicNotFound, Unavailable
from wire.caller import Backoff, Deadline, new_session
from .routes import Route, RouteSubscription

log = logging.getLogger("stator.client")


class StartedByWith:
    """``async with`` starts the client and closes it on the way out, or at once when starting failed. The client
    defines ``start()`` and ``close()``."""

    async def __aenter__(self):
        try:
            await self.start()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


def lone_tls(session: aiohttp.ClientSession | None, ssl_context: ssl.SSLContext | None) -> ssl.SSLContext | None:
    """``ssl_context``, refused beside a lent session: that session's connector already decides TLS, and the context
    would be silently ignored."""
    if session is not None and ssl_context is not None:
        raise ValueError("give session or ssl_context, not both")
    return ssl_context


class TopicClient(StartedByWith):
    topic: str
    routes: RouteSubscription
    _owns_routes: bool
    _session: aiohttp.ClientSession | None
    _owns_session: bool
    _ssl_context: ssl.SSLContext | None = None   # for the session the client makes (and closes)
    _closed: bool
    deadline_s: float
    attempts_max: int        # of one call, for _pause_before_retry
    backoff: Backoff
    _kind = "client"

    def _take_routes(self, meta_urls: Sequence[str] | str, token: str, routes: RouteSubscription | None,
                     route_mode: str, session: aiohttp.ClientSession | None,
                     ssl_context: ssl.SSLContext | None) -> None:
        """The route subscription and the HTTP session: lent ones are used and left open on ``close``, else the
        client opens its own (for ``self.topic``) and closes them. ``ssl_context`` only beside no lent session."""
        self._owns_routes = routes is None
        self._ssl_context = lone_tls(session, ssl_context)
        self.routes = routes or RouteSubscription(meta_urls, token, [self.topic], route_mode, session=session,
                                                  ssl_context=ssl_context)
        self._session = session
        self._owns_session = session is None

    def _check_open(self) -> None:
        if self._closed:
            raise Closed(f"this {self._kind} is closed")

    def session(self) -> aiohttp.ClientSession:
        self._check_open()
        if self._session is None:
            self._session = new_session(self._ssl_context)
        return self._session

    async def _route(self, deadline: Deadline) -> Route:
        """The held route, else the first one from meta within the call's deadline."""
        held = self.routes.route(self.topic)
        if held is not None:
            return held
        try:
            return await asyncio.wait_for(self.routes.get(self.topic), max(0.001, deadline.left_s()))
        except TimeoutError:
            raise Unavailable(f"no route of {self.topic!r} from meta within {self.deadline_s} s") from None

    async def _refresh(self, min_version: int | None, deadline: Deadline) -> None:
        """Re-read the route, within the call's deadline. Raises only ``TopicNotFound``."""
        try:
            await asyncio.wait_for(self.routes.refresh(self.topic, min_version), max(0.001, deadline.left_s()))
        except TopicNotFound:
            raise
        except (StatorError, TimeoutError) as e:  # meta unreachable: keep the route held; the next attempt decides
            log.info("route_refresh_failed", extra={"topic": self.topic, "kind": self._kind, "error": repr(e)})

    async def _pause_before_retry(self, attempt: int, deadline: Deadline) -> bool:
        """After failed attempt ``attempt`` (from 0), wait the backoff before the next one. False, at once, when there
        is no next one: that was attempt ``attempts_max``, or the pause would outlast the call's deadline."""
        if attempt + 1 >= self.attempts_max:
            return False
        pause = self.backoff.delay_s(attempt)
        if pause >= deadline.left_s():
            return False
        await asyncio.sleep(pause)
        return True

    async def start(self) -> None:
        """Fetch the route now (else the first call does)."""
        await self.routes.get(self.topic)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._owns_routes:
            await self.routes.close()
        if self._owns_session and self._session is not None:
            await self._session.close()

