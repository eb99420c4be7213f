"""Keeps big topics' routes rendered and gzip'd as they change, so that a reader never waits for a render.

A 1,000-queue route takes ~9 ms to render and encode; at a million queues the rendered-route cache holds only a
few hundred of them, so a reader of a route nobody read lately waited for that render. This task renders each big
topic's route once per version (coalesced: a topic that changes many times between two passes is rendered once,
and a pass waits for changes to settle, meta/limits.py ROUTE_WARM_*) into the gzip cache, which holds every route at ten million queues (meta/limits.py). Small routes render in well
under a millisecond and are left to the readers. Renders run in worker threads (meta/reads.py route_for), one at a
time; once warm, paced to limits.ROUTE_WARM_DUTY of the wall time, so that they never starve the raft tick
of the GIL (at full speed, three nodes rendering a thousand routes each took the cluster through 3 to 4 elections,
terms 1 to 7 and 1 to 9, while a million queues were created; 0, 1 and 0 elections in three runs paced).

A node that starts says it is ready (/readyz) only once ``warm``: a pass that began after it had caught up with the
leader rendered every big route. Ready straight after the catch-up, a restarted node rendered on demand what its
peers served from the cache: route reads there had a p99 of 86.6 ms against 14.8 ms on the other two (one million
queues, 16 readers, ``python -m ops.bench.scale``); held until warm, 13.9 ms against 13.7 and 14.0, ready 9.9 s
after the kill instead of 4.3. The hold is bounded: limits.ROUTE_WARM_READY_WAIT_MAX_S after the catch-up the node
says it is ready whatever the warm-up's progress (logged; the warm-up goes on, readers render what it has not
reached). Unbounded, a restart at ten million queues took 104.9 s to ready against 18-33 s without the hold: a whole
pass is 10,000 renders of ~5-8 ms each, in one process.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import structlog

from . import limits
from .changefeed import TOPICS
from .image import GROUP_KEY_PREFIX

log = structlog.get_logger("meta.route_warmer")
IDLE_WAIT_S = 1.0
FAILURE_PAUSE_S = 1.0
CATCH_UP_POLL_S = 0.1   # how often a starting node's warm-up looks whether it has caught up


class RouteWarmer:
    def __init__(self, reads, feed, caught_up: Callable[[], bool]):
        """``caught_up``: whether the node has caught up with the leader (Log.is_ready)."""
        self.reads = reads
        self.feed = feed
        self._caught_up = caught_up
        self.rendered = 0   # routes brought into the gzip cache by this task
        self.warm = False   # a pass that began once the node had caught up rendered every big route (never unset)
        self._caught_up_at: float | None = None   # time.monotonic() when the warm-up first saw the node caught up
        self._hold_expired_logged = False

    def _note_catch_up(self) -> bool:
        if self._caught_up_at is None and self._caught_up():
            self._caught_up_at = time.monotonic()
        return self._caught_up_at is not None

    def ready(self) -> bool:
        """Whether the node may say it is ready as far as its routes go: warm, or caught up for longer than
        limits.ROUTE_WARM_READY_WAIT_MAX_S (the warm-up then goes on behind the readiness)."""
        if self.warm:
            return True
        if self._caught_up_at is None or time.monotonic() - self._caught_up_at <= limits.ROUTE_WARM_READY_WAIT_MAX_S:
            return False
        if not self._hold_expired_logged:
            self._hold_expired_logged = True
            log.warning("routes_not_warm_ready_anyway", rendered=self.rendered,
                        waited_s=limits.ROUTE_WARM_READY_WAIT_MAX_S)
        return True

    def _big_topics(self, names: list[str] | None) -> list[str]:
        """The big topics among ``names`` (None: every topic)."""
        def pick(image) -> list[str]:
            source = sorted(image.topics) if names is None else names
            return [n for n in source if not n.startswith(GROUP_KEY_PREFIX) and n in image.topics
                    and image.topics[n]["queues"] >= limits.ROUTE_RENDER_OFFLOAD_QUEUES_MIN]
        return self.reads.read(pick)

    async def _render(self, names: list[str]) -> bool:
        """Each of ``names`` not in the gzip cache at its current version into it; False when a render failed.
        Once warm, paced to limits.ROUTE_WARM_DUTY of the wall time."""
        try:
            for name in names:
                if self.reads.route_gzipped(name):
                    continue
                started = time.monotonic()
                if await self.reads.route_for(name, gzip_ok=True) is not None:
                    self.rendered += 1
                if self.warm:
                    await asyncio.sleep((time.monotonic() - started) * (1 / limits.ROUTE_WARM_DUTY - 1))
                else:
                    self._note_catch_up()   # the hold's bound runs from the catch-up, even in a long first pass
            return True
        except Exception:  # noqa: BLE001 - a failed render must not end the task; readers render on demand
            log.exception("route_warm_failed")
            await asyncio.sleep(FAILURE_PAUSE_S)
            return False

    async def _warm_up(self) -> None:
        """A pass over the image the node restored (most of its routes still hold at the catch-up), then, once the
        node has caught up, passes until one renders every big route (the unchanged are cache lookups)."""
        await self._render(self._big_topics(None))
        while not self._note_catch_up():
            await asyncio.sleep(CATCH_UP_POLL_S)
        while True:
            names = self._big_topics(None)
            started = time.monotonic()
            if await self._render(names):
                log.info("routes_warm", topics=len(names), pass_s=round(time.monotonic() - started, 3),
                         after_catch_up_s=round(time.monotonic() - self._caught_up_at, 3))
                break
        self.warm = True

    async def run(self) -> None:
        """Until cancelled: warm every big topic once the node has caught up, then each one that changes, once
        changes settle."""
        loop = asyncio.get_running_loop()
        scanned = self.feed.version
        await self._warm_up()
        names: list[str] = []
        while True:
            await self._render(names)
            while self.feed.version == scanned:
                await self.feed.wait(TOPICS, IDLE_WAIT_S)
            first_change = loop.time()
            while loop.time() - first_change < limits.ROUTE_WARM_DELAY_MAX_S:
                if not await self.feed.wait(TOPICS, limits.ROUTE_WARM_QUIET_S):
                    break   # quiet
            changed = self.feed.changed_since(scanned)
            scanned = self.feed.version
            names = self._big_topics(None if changed is None else sorted(changed))
