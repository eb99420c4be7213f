"""Reads from other brokers: the physical records and offsets of older segments of a queue.

A peer that failed is remembered as down for PEER_DOWN_S, so a pull never waits on a dead broker twice in a row: it
fails at once for the ranges that broker holds, and the data on live brokers keeps flowing (DESIGN.md invariant 5).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp

from wire.tls import connector
from wire.errors import ApiError, rejection

from .routing import Segment

PEER_CONNECT_TIMEOUT_S = 1.0
PEER_REQUEST_TIMEOUT_S = 5.0
PEER_DOWN_S = 2.0


def unavailable(seg: Segment, reason: str) -> ApiError:
    """The answer for data that sits on an unreachable broker: which broker, and which logic range it holds."""
    return rejection(503, "BROKER_UNAVAILABLE",
                     f"broker {seg.broker} holding offsets [{seg.logic_start}, {seg.logic_end}) of this queue is "
                     f"unreachable", broker=seg.broker, queue=seg.queue, unavailable_from=seg.logic_start,
                     unavailable_to=seg.logic_end, reason=reason)


class Unreachable(Exception):
    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class Peers:
    def __init__(self, token: str, ssl_context: Any = None):
        self._ssl_context = ssl_context   # other brokers' https:// URLs (wire/tls.py)
        self._headers = {"Authorization": f"Bearer {token}"}
        self._http: aiohttp.ClientSession | None = None
        self._down_until: dict[str, float] = {}   # broker -> monotonic time until which it is not asked

    async def start(self) -> None:
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(
            total=PEER_REQUEST_TIMEOUT_S, sock_connect=PEER_CONNECT_TIMEOUT_S), connector=connector(self._ssl_context))

    async def stop(self) -> None:
        if self._http is not None:
            await self._http.close()

    def is_down(self, broker: str) -> bool:
        until = self._down_until.get(broker)
        if until is None:
            return False
        if time.monotonic() >= until:
            del self._down_until[broker]
            return False
        return True

    async def get(self, seg: Segment, path: str) -> dict[str, Any]:
        """GET ``path`` on the broker holding ``seg``; a 503 BROKER_UNAVAILABLE naming the range when it cannot."""
        return await self.request("GET", seg, path)

    async def request(self, method: str, seg: Segment, path: str, json: Any = None) -> dict[str, Any]:
        """``get`` for any method (pop state handed between heads is POSTed), with the same timeouts and memory
        of brokers that are down."""
        try:
            return await self.call(method, seg.broker, seg.address, path, json)
        except Unreachable as e:
            raise unavailable(seg, e.reason) from None

    async def call(self, method: str, broker: str, address: str | None, path: str, json: Any = None,
                   remember_down: bool = True) -> dict[str, Any]:
        """``method path`` on ``broker`` at ``address``: its answer's body; its ApiError when it refused;
        Unreachable when it could not be asked or did not answer (then it is not asked again for PEER_DOWN_S, unless
        ``remember_down`` is False: a background retry loop, which must not keep a broker back from the dead
        marked down for the reads that come next)."""
        if not address:
            raise Unreachable("no address")
        if self.is_down(broker):
            raise Unreachable("recently unreachable")
        try:
            async with self._http.request(method, address + path, headers=self._headers, json=json) as r:
                body = await r.json(content_type=None)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as e:
            if remember_down:
                self._down_until[broker] = time.monotonic() + PEER_DOWN_S
            raise Unreachable(type(e).__name__) from None
        if r.status != 200:
            raise ApiError.from_dict(r.status, body)
        return body
