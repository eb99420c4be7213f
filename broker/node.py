"""One broker: storage, route table, meta link and data plane wired together, started and stopped as one."""

from __future__ import annotations

import asyncio
import os
import time

import structlog
from prometheus_client import CollectorRegistry, Counter

from .config import BrokerConfig
from .data import DataPlane
from .meta_link import MetaLink
from .offsets import OffsetStore
from .routing import RouteTable
from .storage import FLUSH_FSYNC, FLUSH_INTERVAL, QueueConfig, QueueStore

log = structlog.get_logger("broker")
FLUSH_TICK_S = 0.05
RETENTION_CHECK_S = 30.0


class BrokerNode:
    def __init__(self, config: BrokerConfig):
        self.config = config
        self.registry = CollectorRegistry()
        self.metrics_requests = Counter("stator_broker_http_requests_total", "HTTP requests", ["status"],
                                        registry=self.registry)
        os.makedirs(config.data_dir, exist_ok=True)
        qcfg = QueueConfig(flush_policy=FLUSH_FSYNC if config.flush == "fsync" else FLUSH_INTERVAL,
                           flush_interval_ms=config.flush_interval_ms, retention_ms=config.retention_ms,
                           retention_bytes=config.retention_bytes)
        self.store = QueueStore(os.path.join(config.data_dir, "queues"), qcfg)
        self.offsets = OffsetStore(os.path.join(config.data_dir, "offsets.log"))
        self.routes = RouteTable(config.broker)
        self.data = DataPlane(config.broker, self.store, self.routes, self.offsets, config.token)
        self.link = MetaLink(config.broker, config.url, config.zone, config.meta_urls, config.token, self.routes,
                             self.data.max_offsets, self.data.seal)
        self.data.link = self.link
        self._tasks: list[asyncio.Task] = []

    async def start(self) -> None:
        await self.data.start()
        await self.link.start()
        if self.config.flush == "interval":
            self._tasks.append(asyncio.create_task(self._flush_loop()))
        if self.config.retention_ms is not None or self.config.retention_bytes is not None:
            self._tasks.append(asyncio.create_task(self._retention_loop()))

    # Both ticks fsync and delete files, so they run in a thread: the store is thread-safe, and on the event loop
    # they would stall every request, now also while waiting for a queue's lock held by an append's roll.
    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_TICK_S)
            try:
                await asyncio.to_thread(self.store.maybe_flush, int(time.time() * 1000))
            except Exception:
                log.exception("flush_failed")  # that queue is marked failed and refuses writes; others go on

    async def _retention_loop(self) -> None:
        while True:
            await asyncio.sleep(RETENTION_CHECK_S)
            try:
                deleted = await asyncio.to_thread(self.store.apply_retention, int(time.time() * 1000))
                if deleted:
                    log.info("retention_deleted_files", files=deleted)
            except Exception:
                log.exception("retention_failed")

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.link.stop()
        await self.data.stop()
        self.store.close()
        self.offsets.close()
