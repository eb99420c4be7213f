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


class BrokerNode:
    def __init__(self, config: BrokerConfig):
        self.config = config
        self.registry = CollectorRegistry()
        self.metrics_requests = Counter("stator_broker_http_requests_total", "HTTP requests", ["status"],
                                        registry=self.registry)
        os.makedirs(config.data_dir, exist_ok=True)
        qcfg = QueueConfig(flush_policy=FLUSH_FSYNC if config.flush == "fsync" else FLUSH_INTERVAL,
                           flush_interval_ms=config.flush_interval_ms)
        self.store = QueueStore(os.path.join(config.data_dir, "queues"), qcfg)
        self.offsets = OffsetStore(os.path.join(config.data_dir, "offsets.log"))
        self.routes = RouteTable(config.broker)
        self.data = DataPlane(config.broker, self.store, self.routes, self.offsets, config.token)
        self.link = MetaLink(config.broker, config.url, config.zone, config.meta_urls, config.token, self.routes,
                             self.data.max_offsets, self.data.seal)
        self.data.link = self.link
        self._flusher: asyncio.Task | None = None

    async def start(self) -> None:
        await self.data.start()
        await self.link.start()
        if self.config.flush == "interval":
            self._flusher = asyncio.create_task(self._flush_loop())

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_TICK_S)
            self.store.maybe_flush(int(time.time() * 1000))

    async def stop(self) -> None:
        if self._flusher is not None:
            self._flusher.cancel()
        await self.link.stop()
        await self.data.stop()
        self.store.close()
        self.offsets.close()
