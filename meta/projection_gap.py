"""Filling a gap in a node's projection from its peers' history, before the projection goes on from the image.

A gap: versions the projection lacks (after its position) that the image no longer holds (before its
history_start). It opens when a follower installs a snapshot past its projection, when a node starts with an empty
or lost projection in an old cluster, or when the image trims faster than the projection applies (a small window).

How it is filled, and why so:
- in log order, through the projection's ordinary apply: the state tables are folded in order, never over a hole
  (meta/projection/store.py), so the projection pauses at the gap and the node serves what is past it from the image;
- from any peer whose history covers the range: the client's history reader fails over between the peers, and a
  peer lacking the range answers 503 HISTORY_UNAVAILABLE, so the next one is asked (meta/projection/sources.py);
- checked against this node's own log at both ends: the peer's event at the projection's position must equal the
  projection's own, and the peer's event at history_start must equal the image's first event, byte for byte as
  stored. Pages in between are checked for contiguity and shape. The end check comes before the last page is
  applied; the pages before it are already in (holding a whole gap in memory is not bounded) and came from a peer
  that agreed with this node's log where the range starts;
- in rounds with a bounded backoff (PROJECTION_FILL_BACKOFF_S_MIN..MAX) while no peer can serve the range, for as
  long as the gap is open: the gap shows meanwhile in /readyz and in stator_meta_projection_gap_versions;
- stoppable: it runs inside the projection follower's task, and stopping the node cancels that task.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import structlog

from wire.errors import StatorError
from wire.caller import Backoff

from . import limits

log = structlog.get_logger("meta.projection")

# One page's call to the peers: every peer once, then once more after a pause (MetaCaller's own retry loop).
CALL_ATTEMPTS_PER_PEER = 2


class GapFiller:
    def __init__(self, peers: list[str], token: str, ssl_context: Any = None):
        self.ssl_context = ssl_context   # peers' https:// URLs (wire/tls.py)
        self.peers = peers
        self.token = token
        self.backoff = Backoff(limits.PROJECTION_FILL_BACKOFF_S_MIN, limits.PROJECTION_FILL_BACKOFF_S_MAX)
        self.rounds_failed = 0

    async def fill(self, store, position: int, image_start: Callable[[], tuple[int, dict[str, Any] | None]],
                   applied: Callable[[int], None]) -> int:
        """Apply peers' events until the projection reaches the image's history; returns the new position.

        ``image_start()`` gives (history_start, the image's stored event at history_start or None);
        ``applied(position)`` is told after every page, so readers see the projection grow."""
        # Imported here: SQLAlchemy and the client stay off a node's import path until a projection is opened.
        from .projection import ProjectionGap
        from .projection.sources import SourceError
        failures = 0
        loop = asyncio.get_running_loop()
        while True:
            start, first = image_start()
            if position >= start - 1:
                return position
            try:
                if failures:  # a failed round may have applied some pages before it failed
                    position = await loop.run_in_executor(None, store.position)
                    if position >= start - 1:
                        continue
                if not self.peers:
                    raise SourceError("no peer to fill the projection's gap from: a single node's lost history can "
                                      "only come from an export (stator meta rebuild-projection --from-export)")
                position = await self._round(store, position, start, first, applied)
                failures = 0
            except Exception as e:  # noqa: BLE001 - peers away, a stranger's history, the database away: retry
                self.rounds_failed += 1
                pause = self.backoff.delay_s(failures)
                failures += 1
                expected = isinstance(e, (StatorError, SourceError, ProjectionGap))
                log.warning("projection_fill_failed", position=position, history_start=start,
                            error=str(e) if expected else repr(e), retry_in_s=round(pause, 2),
                            exc_info=not expected)
                await asyncio.sleep(pause)

    async def _round(self, store, position: int, start: int, first: dict[str, Any] | None,
                     applied: Callable[[int], None]) -> int:
        from client.admin import AdminClient

        from .projection import ProjectionGap
        from .projection.sources import SourceError, peer_pages
        loop = asyncio.get_running_loop()
        own_last = None
        if position > 0:
            found = await loop.run_in_executor(None, lambda: store.history(after=position - 1, limit=1))
            own_last = found[0] if found and found[0]["version"] == position else None
            if own_last is None:
                raise ProjectionGap(position, position)  # cannot happen while apply keeps the table contiguous
        log.info("projection_fill", position=position, history_start=start, missing=start - 1 - position)
        async with AdminClient(self.peers, self.token, attempts_max=CALL_ATTEMPTS_PER_PEER * len(self.peers),
                               deadline_s=limits.PROJECTION_FILL_CALL_S_MAX, monotonic_reads=False,
                               ssl_context=self.ssl_context) as admin:
            # One event of overlap at each end: the projection's last (after - 1) and the image's first (through).
            after = position - 1 if own_last is not None else position
            through = start if first is not None else start - 1
            async for page in peer_pages(admin, after, through, limits.PROJECTION_FILL_PAGE_EVENTS):
                if own_last is not None and page[0]["version"] == position:
                    if page[0] != own_last:
                        raise SourceError(f"the history of {admin.meta.url} differs from this node's at version "
                                          f"{position}: a peer on another log")
                    page = page[1:]
                if first is not None and page and page[-1]["version"] == start:
                    if page[-1] != first:
                        raise SourceError(f"the history of {admin.meta.url} differs from this node's image at "
                                          f"version {start}: a peer on another log")
                    page = page[:-1]
                if page:
                    position = await loop.run_in_executor(None, store.apply, page)
                    applied(position)
        log.info("projection_filled", position=position, history_start=start)
        return position

