"""Keeps big topics' routes rendered and gzip'd as they change, so that a reader never waits for a render.

A 1,000-queue route takes ~9 ms to render and encode; at a million queues the rendered-route cache holds only a
few hundred of them, so a reader of a route nobody read lately waited for that render. This task renders each big
topic's route once per version (coalesced: a topic that changes many times between two passes is rendered once,
and a pass waits for changes to settle, meta/limits.py ROUTE_WARM_*) into the gzip cache, which holds every route at ten million queues (meta/limits.py). Small routes render in well
under a millisecond and are left to the readers. Renders run in worker threads (meta/reads.py route_for).
"""

from __future__ import annotations

import asyncio

import structlog

from . import limits
from .changefeed import TOPICS
from .image import GROUP_KEY_PREFIX

log = structlog.get_logger("meta.route_warmer")
IDLE_WAIT_S = 1.0
FAILURE_PAUSE_S = 1.0


class RouteWarmer:
    def __init__(self, reads, feed):
        self.reads = reads
        self.feed = feed
        self.rendered = 0   # routes brought into the gzip cache by this task

    def _big_topics(self, names: list[str] | None) -> list[str]:
        """The big topics among ``names`` (None: every topic)."""
        def pick(image) -> list[str]:
            source = sorted(image.topics) if names is None else names
            return [n for n in source if not n.startswith(GROUP_KEY_PREFIX) and n in image.topics
                    and image.topics[n]["queues"] >= limits.ROUTE_RENDER_OFFLOAD_QUEUES_MIN]
        return self.reads.read(pick)

    async def run(self) -> None:
        """Until cancelled: warm every big topic once, then each one that changes, once changes settle."""
        loop = asyncio.get_running_loop()
        scanned = self.feed.version
        names = self._big_topics(None)
        while True:
            try:
                for name in names:
                    if await self.reads.route_for(name, gzip_ok=True) is not None:
                        self.rendered += 1
            except Exception:  # noqa: BLE001 - a failed render must not end the task; readers render on demand
                log.exception("route_warm_failed")
                await asyncio.sleep(FAILURE_PAUSE_S)
            while self.feed.version == scanned:
                await self.feed.wait(TOPICS, IDLE_WAIT_S)
            first_change = loop.time()
            while loop.time() - first_change < limits.ROUTE_WARM_DELAY_MAX_S:
                if not await self.feed.wait(TOPICS, limits.ROUTE_WARM_QUIET_S):
                    break   # quiet
            changed = self.feed.changed_since(scanned)
            scanned = self.feed.version
            names = self._big_topics(None if changed is None else sorted(changed))
