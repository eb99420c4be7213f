"""Feeds applied events from the image's bounded history into the SQL projection, in batches, off the event loop.

The projection stores its position with its rows (meta/projection), so this loop may replay a batch it already
wrote (after a crash, say) without harm. It serves history older than the image keeps, never decisions.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING

import structlog

from .changefeed import ANY

if TYPE_CHECKING:
    from .service import MetaService

log = structlog.get_logger("meta.projection")

BATCH_EVENTS_MAX = 2_000
IDLE_WAIT_S = 1.0
# Wait this long after a batch before the next: under a write load each transaction then carries hundreds of
# events instead of one (a transaction per event cost the leader ~15% of its CPU).
BATCH_PAUSE_S = 0.2


class ProjectionFollower:
    def __init__(self, url: str, service: "MetaService"):
        self.url = url
        self.service = service
        self.store = None
        self.position = 0
        self.gaps = 0

    def _open(self):
        from .projection import SqlProjection  # imported lazily: SQLAlchemy start-up stays off the import path
        store = SqlProjection(self.url)
        store.migrate()
        return store

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        self.store = await loop.run_in_executor(None, self._open)
        self.position = await loop.run_in_executor(None, self.store.position)
        while True:
            batch, start = self.service.read(lambda im: (im.history_after(self.position, BATCH_EVENTS_MAX),
                                                         im.data["history_start"]))
            if start > self.position + 1:
                # The image no longer holds these events (this node was restored from a snapshot past them).
                self.gaps += 1
                log.warning("projection_gap", position=self.position, history_start=start)
            if not batch:
                await self.service.feed.wait(ANY, IDLE_WAIT_S)
                continue
            try:
                self.position = await loop.run_in_executor(None, self._apply, batch)
            except Exception:
                log.exception("projection_apply_failed", position=self.position)
                await asyncio.sleep(IDLE_WAIT_S)
            await asyncio.sleep(BATCH_PAUSE_S)

    def _apply(self, batch: list[str]) -> int:
        # Parsing happens here, in the worker thread, not on the event loop: a topic of a thousand queues is an
        # event of ~130 KB.
        return self.store.apply([json.loads(e) for e in batch])

    def history(self, after: int, topic: str | None, limit: int) -> list[dict]:
        return self.store.history(after=after, topic=topic, limit=limit) if self.store else []

    def close(self) -> None:
        if self.store is not None:
            self.store.close()
