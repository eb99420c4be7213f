"""What a producer and a consumer share: one topic's route subscription and an HTTP session, owned or lent,
opened on ``start`` (or entry) and closed once."""

from __future__ import annotations

import aiohttp

from .errors import Closed
from .http import new_session
from .routes import RouteSubscription


class TopicClient:
    topic: str
    routes: RouteSubscription
    _owns_routes: bool
    _session: aiohttp.ClientSession | None
    _owns_session: bool
    _closed: bool
    _kind = "client"

    def _check_open(self) -> None:
        if self._closed:
            raise Closed(f"this {self._kind} is closed")

    def session(self) -> aiohttp.ClientSession:
        self._check_open()
        if self._session is None:
            self._session = new_session()
        return self._session

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

    async def __aenter__(self):
        try:
            await self.start()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
