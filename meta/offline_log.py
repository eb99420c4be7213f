"""Reading a stopped node's own log (snapshot + journal) without joining the cluster.

Used by `stator meta rebuild-projection`: replay the committed entries through the same state machine the node runs,
then hand the retained event history to the projection. The snapshot is read by the same parser the node restores
from (``snapshot_file``); the journal is read and checked by ``raft.journal``, as the node reads it.

The log holds the newest events only: the image's history window, plus what the window trimmed while the journal
was replayed over an older snapshot. The versions before them come from a peer's ``/v1/history`` or from a Parquet
export (meta/projection/sources.py), checked for contiguity, and checked against this node's own log where the two
meet: the source's event at the log's first version must equal the log's.
Without a source, a node whose image lacks the oldest versions is refused before anything is dropped: a rebuild
never leaves a hole.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections import deque
from collections.abc import AsyncIterator, Iterator
from typing import Any

from . import history_lines
from .raft import pysyncobj_shim as shim
from .raft import snapshot_file
from .config import MetaConfig
from .image import Image
from .raft.journal import journal_exists, read_journal
from .raft.entry import decode_entry
from .raft.node import SNAPSHOT_FILE
from .state_machine import StateMachine


def load_image(config: MetaConfig) -> Image:
    """The image as of the last committed entry in the node's data directory."""
    return image_from_data_dir(config.data_dir)


def image_from_data_dir(data_dir: str, keep_trimmed: bool = False) -> Image:
    """With ``keep_trimmed``, what the window trims during the replay stays in ``image.trimmed_to``, as on a running
    node: the log may hold older versions than the image's window (a snapshot older than the journal's end)."""
    snapshot = os.path.join(data_dir, SNAPSHOT_FILE)
    image, last_index = Image(), 0
    if os.path.exists(snapshot):
        restored = snapshot_file.read(snapshot)
        image, last_index = Image(restored.image), restored.last_applied.index
    if keep_trimmed:
        image.trimmed_to = deque()  # bounded by the journal, which compaction keeps short
    if journal_exists(data_dir):
        machine = StateMachine(image)
        journal = read_journal(data_dir)   # checked as the node checks it; never repaired from here
        for command, index, _term in journal.entries:
            payload = shim.envelope_bytes(command)
            if last_index < index <= journal.commit_index and payload is not None:
                for envelope in decode_entry(payload):
                    machine.apply(envelope)
    return image


def rebuild_projection(config: MetaConfig, *, from_peer: str | None = None, token: str | None = None,
                       from_export: str | None = None) -> dict[str, Any]:
    """Drop the node's projection and rebuild it: versions before the image's window from the source, the rest from
    the node's own log. Returns {"position", "from_source"}: the events taken from the source."""
    return asyncio.run(_rebuild(config, from_peer, token, from_export))


async def _rebuild(config: MetaConfig, from_peer: str | None, token: str | None,
                   from_export: str | None) -> dict[str, Any]:
    from .projection import APPLY_BATCH_MAX, SqlProjection
    from .projection.sources import SourceError
    image = image_from_data_dir(config.data_dir, keep_trimmed=True)
    own = history_lines.unpacked(line for _v, line in image.trimmed_to) + image.history_lines()
    start = image.trimmed_to[0][0] if image.trimmed_to else image.data["history_start"]
    first = json.loads(own[0]) if own else None
    if start > 1 and from_peer is None and from_export is None:
        raise SourceError(f"this node's log holds versions {start}..{image.version} only: give --from-peer URL or "
                          f"--from-export DIR for versions 1..{start - 1}")
    projection = SqlProjection(config.projection_url)
    try:
        projection.drop()
        projection.migrate()
        taken = 0
        if start > 1:
            source = (_peer_events(from_peer, token, start, first) if from_peer is not None
                      else _aiter(_export_events(from_export, start, first)))
            batch: list[dict[str, Any]] = []
            async for e in source:
                batch.append(e)
                taken += 1
                if len(batch) >= APPLY_BATCH_MAX:
                    projection.apply(batch)
                    batch = []
            projection.apply(batch)
        _apply_lines(projection, own)
        return {"position": projection.position(), "from_source": taken}
    finally:
        projection.close()


def apply_image_history(projection: Any, image: Image) -> None:
    """The events the image's window holds, into ``projection`` (after the older ones, which it must already have)."""
    _apply_lines(projection, image.history_lines())


def _apply_lines(projection: Any, lines: list[str]) -> None:
    from .projection import APPLY_BATCH_MAX
    for i in range(0, len(lines), APPLY_BATCH_MAX):
        projection.apply([json.loads(e) for e in lines[i:i + APPLY_BATCH_MAX]])


def _anchored(events: Iterator[dict[str, Any]] | list[dict[str, Any]], start: int, first: dict[str, Any] | None,
              source: str) -> Iterator[dict[str, Any]]:
    """The events before ``start``; the one at ``start`` must be the image's own (the source is this log)."""
    from .projection.sources import SourceError
    for e in events:
        if e["version"] < start:
            yield e
        elif first is not None and e["version"] == start and e != first:
            raise SourceError(f"{source} differs from this node's log at version {start}: another cluster's history?")


def _export_events(directory: str, start: int, first: dict[str, Any] | None) -> Iterator[dict[str, Any]]:
    from .projection.sources import export_events
    # The export may end right before the image's window (then there is nothing to compare) or reach into it.
    through = start if first is not None else start - 1
    yield from _anchored(export_events(directory, through, required=start - 1), start, first,
                         f"the export at {directory}")


async def _peer_events(url: str, token: str | None, start: int,
                       first: dict[str, Any] | None) -> AsyncIterator[dict[str, Any]]:
    from client.admin import AdminClient

    from . import limits
    from .projection.sources import peer_pages
    async with AdminClient(url, token, monotonic_reads=False) as admin:
        through = start if first is not None else start - 1
        async for page in peer_pages(admin, 0, through, limits.PROJECTION_FILL_PAGE_EVENTS):
            for e in _anchored(page, start, first, f"the history of {url}"):
                yield e


async def _aiter(events: Iterator[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
    for e in events:
        yield e
