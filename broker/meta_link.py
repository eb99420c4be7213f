"""Everything a broker says to and hears from meta: registration, heartbeats, the watch stream, seal reports.

Session rule (DESIGN.md invariant 4): the broker counts its session from the *send* time of its last acknowledged
heartbeat; once that is older than the session timeout it refuses writes, before meta can have fenced it.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Awaitable, Callable

import aiohttp
import structlog

from .routing import RouteTable, Segment

log = structlog.get_logger("broker.meta")

REQUEST_TIMEOUT_S = 5.0
RETRY_BACKOFF_MAX_S = 2.0
SSE_LINE_BYTES_MAX = 64 * 1024 * 1024
SEAL_RETRY_S = 0.2


class MetaLink:
    def __init__(self, broker: str, address: str, zone: str | None, meta_urls: tuple[str, ...], token: str,
                 routes: RouteTable, max_offsets: Callable[[list[Segment]], dict[str, int]],
                 seal: Callable[[Segment], Awaitable[int]]):
        self.broker = broker
        self.address = address
        self.zone = zone
        self.meta_urls = list(meta_urls)
        self.routes = routes
        self._max_offsets = max_offsets
        self._seal = seal
        self._headers = {"Authorization": f"Bearer {token}"}
        self.epoch: int | None = None
        self.state = "unregistered"
        self.session_timeout_ms = 9_000
        self.heartbeat_interval_ms = 2_000
        self.last_ack_sent = 0.0           # monotonic send time of the last acknowledged heartbeat
        self.budgets: dict[str, int] = {}
        self.route_changed = asyncio.Event()
        self._beat_now = asyncio.Event()
        self._sealing: dict[str, asyncio.Task] = {}
        self._http: aiohttp.ClientSession | None = None
        self._tasks: list[asyncio.Task] = []
        self._meta_i = 0

    # -- lifecycle ---------------------------------------------------------------------------------------------
    async def start(self) -> None:
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S))
        self._tasks = [asyncio.create_task(self._heartbeat_loop(), name="heartbeats"),
                       asyncio.create_task(self._watch_loop(), name="watch")]

    async def stop(self) -> None:
        for t in [*self._tasks, *self._sealing.values()]:
            t.cancel()
        await asyncio.gather(*self._tasks, *self._sealing.values(), return_exceptions=True)
        if self._http is not None:
            await self._http.close()

    # -- session -----------------------------------------------------------------------------------------------
    def session_active(self) -> bool:
        return (self.state == "active" and self.epoch is not None
                and (time.monotonic() - self.last_ack_sent) * 1000 < self.session_timeout_ms)

    def beat_soon(self) -> None:
        self._beat_now.set()

    def _meta(self) -> str:
        return self.meta_urls[self._meta_i % len(self.meta_urls)]

    def _next_meta(self) -> None:
        self._meta_i += 1

    async def _call(self, method: str, path: str, body: dict) -> tuple[int, dict]:
        async with self._http.request(method, self._meta() + path, json=body, headers=self._headers) as r:
            return r.status, await r.json(content_type=None)

    async def _register(self) -> None:
        status, body = await self._call("PUT", f"/v1/brokers/{self.broker}", {"address": self.address, "zone": self.zone})
        if status != 200:
            raise RuntimeError(f"registration refused: {status} {body}")
        self.epoch = body["epoch"]
        self.state = "active"
        self.last_ack_sent = time.monotonic()
        log.info("broker_registered", epoch=self.epoch)

    async def _heartbeat(self) -> None:
        if self.epoch is None:
            await self._register()
        sent = time.monotonic()
        queues = self._max_offsets(self.routes.live_hosted())
        status, body = await self._call("POST", f"/v1/brokers/{self.broker}/heartbeat",
                                        {"epoch": self.epoch, "queues": queues})
        code = body.get("error", {}).get("code") if isinstance(body, dict) else None
        if status == 200:
            self.state = body["state"]
            self.last_ack_sent = sent
            self.budgets.update(body.get("budgets", {}))
            self.session_timeout_ms = body.get("session_timeout_ms", self.session_timeout_ms)
            self.heartbeat_interval_ms = body.get("heartbeat_interval_ms", self.heartbeat_interval_ms)
        elif code in ("STALE_EPOCH", "BROKER_NOT_FOUND"):
            self.epoch = None  # register again with a new epoch on the next beat
            self._beat_now.set()
        else:
            raise RuntimeError(f"heartbeat refused: {status} {code}")

    async def _heartbeat_loop(self) -> None:
        backoff = 0.05
        while True:
            try:
                await self._heartbeat()
                backoff = 0.05
                wait = self.heartbeat_interval_ms / 1000
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("heartbeat_failed", meta=self._meta(), error=f"{type(e).__name__}: {e}")
                self._next_meta()
                wait = backoff
                backoff = min(backoff * 2, RETRY_BACKOFF_MAX_S)
            self._beat_now.clear()
            try:
                await asyncio.wait_for(self._beat_now.wait(), wait)
            except asyncio.TimeoutError:
                pass

    # -- watch stream ------------------------------------------------------------------------------------------
    async def _watch_loop(self) -> None:
        backoff = 0.05
        while True:
            url = f"{self._meta()}/v1/watch?after={self.routes.version}"
            try:
                timeout = aiohttp.ClientTimeout(total=None, sock_connect=REQUEST_TIMEOUT_S, sock_read=60)
                async with self._http.get(url, headers=self._headers, timeout=timeout) as r:
                    if r.status != 200:
                        raise RuntimeError(f"watch refused: {r.status}")
                    backoff = 0.05
                    await self._forget_deleted_topics()
                    await self._read_events(r)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("watch_failed", meta=self._meta(), error=f"{type(e).__name__}: {e}")
                self._next_meta()
                await asyncio.sleep(backoff + random.random() * backoff)
                backoff = min(backoff * 2, RETRY_BACKOFF_MAX_S)

    async def _forget_deleted_topics(self) -> None:
        """A stream opened with ``after=V`` sends what changed since V, but cannot name topics deleted while this
        broker was not listening: drop every route whose topic meta no longer lists (it must not take writes)."""
        # Read at least at the version this broker already knows: a meta node still replaying its log after a
        # restart would otherwise list too few topics, and live routes would be dropped.
        url = f"{self._meta()}/v1/topics?min_version={self.routes.version}"
        async with self._http.get(url, headers=self._headers) as r:
            if r.status != 200:
                raise RuntimeError(f"topic list refused: {r.status}")
            listed = {t["topic"] for t in (await r.json())["topics"]}
        for topic in [t for t in self.routes.routes if t not in listed]:
            self.routes.delete(topic, self.routes.version)
            self.route_changed.set()

    async def _read_events(self, resp: aiohttp.ClientResponse) -> None:
        event, data = None, []
        while True:
            line = await resp.content.readline()
            if not line:
                return
            line = line.rstrip(b"\r\n")
            if not line:
                if event and data:
                    self._on_event(event, b"\n".join(data))
                event, data = None, []
            elif line.startswith(b"event:"):
                event = line[6:].strip().decode()
            elif line.startswith(b"data:"):
                data.append(line[5:].lstrip())

    def _on_event(self, event: str, data: bytes) -> None:
        body = json.loads(data)
        if event == "route":
            if self.routes.update(body):
                self._after_route_change(body["topic"])
        elif event == "deleted":
            self.routes.delete(body["topic"], body["version"])
            self.route_changed.set()

    def _after_route_change(self, topic: str) -> None:
        self.route_changed.set()
        for seg in self.routes.live_hosted():
            if seg.topic == topic and seg.state == "sealing" and seg.physical_queue not in self._sealing:
                self._sealing[seg.physical_queue] = asyncio.create_task(self._report_seal(seg))
        self.beat_soon()  # new segments want their budgets now, not in two seconds

    async def _report_seal(self, seg: Segment) -> None:
        """Stop writes to the segment at once, then tell meta its exact end until meta has recorded it."""
        try:
            end = await self._seal(seg)
            while True:
                current = self.routes.hosted.get(seg.physical_queue)
                if current is None or current.state == "sealed":
                    return
                try:
                    status, body = await self._call("POST", f"/v1/brokers/{self.broker}/seal", {
                        "epoch": self.epoch, "topic": seg.topic, "queue": seg.queue, "gen": seg.gen, "end_offset": end,
                        "physical_queue": seg.physical_queue})
                    code = body.get("error", {}).get("code") if isinstance(body, dict) else None
                    if status == 200 or code in ("ALREADY_SEALED", "SEGMENT_NOT_FOUND", "TOPIC_NOT_FOUND"):
                        log.info("segment_sealed", pq=seg.physical_queue, end=end, status=status, code=code)
                        return
                    if code == "STALE_EPOCH":
                        self.epoch = None
                        self._beat_now.set()
                    log.warning("seal_refused", pq=seg.physical_queue, status=status, code=code)
                except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
                    log.warning("seal_report_failed", error=type(e).__name__)
                    self._next_meta()
                await asyncio.sleep(SEAL_RETRY_S)
        finally:
            self._sealing.pop(seg.physical_queue, None)
