"""Feeds applied events from the image's bounded history into the SQL projection, in batches, off the event loop
and out of the node's process: the writes run in a child (meta/projection/writer_process.py says why); reads of
history are served here, from a reader of the same database.

The projection stores its position with its rows (meta/projection), so this loop may replay a batch it already
wrote (after a crash, say) without harm. It serves history older than the image keeps, never decisions.

The projection holds every version 1..position (its apply refuses a hole). When the image no longer holds the
versions right after the position (a gap: see meta/projection_gap.py), the loop fills them from peers first and
only then goes on from the image; ``gap_versions()`` is what /readyz and the metrics report meanwhile.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
from collections.abc import Callable
from typing import Any

import structlog

from wire.caller import Backoff
from wire.errors import rejection
from wire.waits import wait_set

from . import history_lines, limits
from .changefeed import ANY, ChangeFeed
from .projection_gap import GapFiller

log = structlog.get_logger("meta.projection")

BATCH_EVENTS_MAX = 2_000
# And at most this much event text per batch (past the first event): a batch is parsed whole, and 2,000 creations of
# 1,000-queue topics would be ~260 MB of text and ten times that parsed.
BATCH_CHARS_MAX = 8 * 1024 * 1024
IDLE_WAIT_S = 1.0
# Wait this long after a batch before the next: under a write load each transaction then carries hundreds of
# events instead of one (a transaction per event cost the leader ~15% of its CPU).
BATCH_PAUSE_S = 0.2


class ProjectionFollower:
    def __init__(self, url: str, *, node: str, log_level: str, feed: ChangeFeed, read: Callable[[Callable], Any],
                 peers: list[str], token: str, ssl_context: Any = None):
        """``read(fn)`` runs ``fn`` on the applied image (the service's reads, ready once the node has started);
        ``feed`` wakes the follower when versions are applied."""
        self.url = url
        self.node = node
        self.log_level = log_level
        self.feed = feed
        self.read = read
        self.store = None       # the writer process: every write, the position and the hole
        self.reader = None      # this process's own connection for reads of history, made at the first one
        self._reader_lock = threading.Lock()   # history is read from executor threads
        self._closed = False
        self.position = 0       # the store's position as last applied: versions 1..position are all in it
        self.opened = False     # until then position is not known (0), and the gap not either
        self._opened = asyncio.Event()
        self.hole: tuple[int, int] | None = None  # versions missing below the position (written by older code)
        self.gaps = 0
        self.filler = GapFiller(peers, token, ssl_context)

    def _open(self):
        from .projection.writer_process import WriterProcess
        store = WriterProcess(self.url, self.log_level, node=self.node)
        try:
            store.migrate()
            hole = store.first_hole()
            position = store.position()
        except BaseException:
            store.close()
            raise
        if hole is not None:
            # Written before apply refused holes: its state tables were folded over the hole. Nothing is dropped
            # (its events may be the last copy somewhere); history is served from it only below the hole, and the
            # operator rebuilds it from a peer or an export, which a running node cannot do under its own readers.
            log.error("projection_has_holes", first=hole[0], last=hole[1], position=position,
                      fix="stop the node; stator meta rebuild-projection --from-peer URL (or --from-export DIR)")
        return store, hole, position

    async def _open_until_open(self) -> None:
        """Open the writer, again and again until it opens: a writer killed while it starts, or a database not
        reachable yet, must not end the projection for the node's whole life (history past the image would never
        be served again, and nothing would say why)."""
        loop = asyncio.get_running_loop()
        backoff = Backoff(limits.PROJECTION_OPEN_BACKOFF_S_MIN, limits.PROJECTION_OPEN_BACKOFF_S_MAX)
        for attempt in itertools.count():
            try:
                self.store, self.hole, self.position = await loop.run_in_executor(None, self._open)
                return
            except Exception as e:  # noqa: BLE001 - whatever stopped it, the next attempt may not meet it
                delay_s = backoff.delay_s(attempt)
                log.warning("projection_open_failed", attempt=attempt + 1, retry_in_s=round(delay_s, 2),
                            error=f"{type(e).__name__}: {e}")
                await asyncio.sleep(delay_s)

    async def wait_opened(self, timeout_s: float) -> bool:
        """Whether the projection is open (its position known) within ``timeout_s``: right after a start, history
        the node holds on disk is served once its projection is open, not refused while it opens."""
        if not self.opened:
            await wait_set(self._opened, timeout_s)
        return self.opened

    def served_through(self) -> int:
        """Versions 1..this are all in the projection: what /v1/history may serve from it."""
        return self.hole[0] - 1 if self.hole is not None else self.position

    def gap_versions(self) -> int:
        """Versions in neither the image nor the projection (0 when the two together hold the whole history).
        Until the projection is opened its position counts as 0: history serves nothing from it yet either."""
        def gap(image) -> int:
            held = self.position
            trimmed = image.trimmed_to
            if trimmed and trimmed[0][0] <= held + 1:  # trimmed lines that continue the projection: about to apply
                held = max(held, trimmed[-1][0])
            return max(0, image.data["history_start"] - 1 - held)
        hole = self.hole[1] - self.hole[0] + 1 if self.hole is not None else 0
        return hole + self.read(gap)

    def _image_start(self) -> tuple[int, dict | None]:
        start, kept = self.read(lambda im: (im.data["history_start"], im.history_kept_after(0, 1)))
        return start, json.loads(history_lines.unpack(kept[0])) if kept else None

    def _next_batch(self, image) -> tuple[list[str], int]:
        """(lines after the position as kept, history_start), under the image lock: from the image's history, or
        else from what its window trimmed since (kept on this node for the projection: meta/image.py trimmed_to).
        Big lines stay packed here: they are unpacked in the worker thread (``_apply``), not under the lock."""
        start = image.data["history_start"]
        trimmed = image.trimmed_to
        if trimmed is not None:
            while trimmed and trimmed[0][0] <= self.position:  # already applied: keep the memory it held free
                trimmed.popleft()
        if start <= self.position + 1:
            return image.history_kept_after(self.position, BATCH_EVENTS_MAX), start
        if trimmed and trimmed[0][0] == self.position + 1:
            return [line for _v, line in itertools.islice(trimmed, BATCH_EVENTS_MAX)], start
        return [], start

    def _applied(self, position: int) -> None:
        self.position = position

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        await self._open_until_open()
        self.opened = True
        self._opened.set()
        while True:
            batch, start = self.read(self._next_batch)
            if start > self.position + 1 and not batch:
                # The image no longer holds these events (a snapshot installed past them, an empty projection in an
                # old cluster, or a window trimmed faster than the projection applied): take them from peers first.
                self.gaps += 1
                log.warning("projection_gap", position=self.position, history_start=start)
                self.position = await self.filler.fill(self.store, self.position, self._image_start, self._applied)
                continue
            if not batch:
                await self.feed.wait(ANY, IDLE_WAIT_S)
                continue
            try:
                self.position = await loop.run_in_executor(None, self._apply, batch)
            except Exception:
                log.exception("projection_apply_failed", position=self.position)
                await asyncio.sleep(IDLE_WAIT_S)
            await asyncio.sleep(BATCH_PAUSE_S)

    def _apply(self, kept: list[str]) -> int:
        # Unpacked here, in the worker thread, up to BATCH_CHARS_MAX (the rest comes next round: the follower goes
        # by position); parsed by the writer process: a topic of a thousand queues is an event of ~130 KB.
        return self.store.apply_lines(history_lines.unpacked(kept, BATCH_CHARS_MAX))

    def _reader(self):
        # Made at the first read, not at start: most nodes never read history older than their image, and the
        # reader is what would import SQLAlchemy into the node's process (~0.4 s of CPU at every start).
        with self._reader_lock:
            if self._closed:
                raise RuntimeError("the projection is closed: the node is stopping")
            if self.reader is None:
                from .projection import SqlProjection
                self.reader = SqlProjection(self.url)
            return self.reader

    def history(self, after: int, topic: str | None, limit: int, through: int) -> list[dict]:
        if not self.opened:
            return []
        try:
            return self._reader().history(after=after, topic=topic, limit=limit, through=through)
        except Exception as e:  # noqa: BLE001 - the database away is the caller's 503, not a 500
            log.warning("projection_history_failed", error=repr(e))
            raise rejection(503, "HISTORY_UNAVAILABLE", "this node's projection database could not be read: "
                            f"{type(e).__name__}; ask another node", node=self.node) from None

    def close(self) -> None:
        if self.store is not None:
            self.store.close()
        with self._reader_lock:
            self._closed = True   # a read still in flight must not open a reader that nothing would close
            if self.reader is not None:
                self.reader.close()
