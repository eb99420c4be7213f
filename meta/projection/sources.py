"""Where a projection takes the events its own node no longer holds: a peer's ``/v1/history`` or a Parquet export.

Both yield stored events (``{"version","ts","type","v","topic","data"}``, the form meta/events.py ``stored`` gives)
in pages, each page checked before anyone applies it:
- contiguous: every version after ``after`` exactly once, in order (a source with a hole is refused, never skipped);
- shaped like the log's stored events (version, ts, type, v, topic, data, with the topic the data names) and with
  times that never step back, as the log's times never do.
Whether the events are *this* log's is checked by whoever has a piece of the log to compare with: the gap filler
(meta/projection_gap.py) and the offline rebuild (meta/offline_log.py) compare the events at both ends of a range
with the ones they hold themselves.

Peers are read through the client's one history reader (client.AdminClient.iter_history), which fails over between
the peers it is given: a peer that lacks the range answers 503 HISTORY_UNAVAILABLE, and the next peer is asked.
"""

from __future__ import annotations

import os
import re
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from client.admin import AdminClient

STORED_KEYS = {"version", "ts", "type", "v", "topic", "data"}
_PART_RE = re.compile(r"^part-(\d+)-(\d+)\.parquet$")


class SourceError(RuntimeError):
    """A source of history that cannot give what was asked: a hole, a malformed event, an unreadable export."""


class PageChecker:
    """Checks consecutive pages of one range: contiguity from ``after + 1`` and the stored-event shape."""

    def __init__(self, after: int, source: str):
        self.last = after
        self.last_ts = 0
        self.source = source

    def check(self, events: list[dict[str, Any]]) -> None:
        for e in events:
            if not isinstance(e, dict) or set(e) != STORED_KEYS:
                raise SourceError(f"{self.source}: after version {self.last} came something that is not a stored "
                                  f"event: {str(e)[:200]}")
            if e["version"] != self.last + 1:
                raise SourceError(f"{self.source} has no events {self.last + 1}..{e['version'] - 1}")
            if not _stored_shape(e):
                raise SourceError(f"{self.source}: event {e['version']} is malformed: {str(e)[:200]}")
            if e["ts"] < self.last_ts:
                raise SourceError(f"{self.source}: event {e['version']} has a time before its predecessor's")
            self.last, self.last_ts = e["version"], e["ts"]


def _stored_shape(e: dict[str, Any]) -> bool:
    def is_int(x: Any) -> bool:
        return isinstance(x, int) and not isinstance(x, bool)
    return (is_int(e["ts"]) and e["ts"] >= 0 and isinstance(e["type"], str) and bool(e["type"])
            and is_int(e["v"]) and e["v"] >= 1 and isinstance(e["data"], dict)
            and (e["topic"] is None or isinstance(e["topic"], str)) and e["data"].get("topic") == e["topic"])


async def peer_pages(admin: "AdminClient", after: int, through: int, page: int) -> AsyncIterator[list[dict[str, Any]]]:
    """Pages (at most ``page`` events each) of versions after..through, from the peers ``admin`` talks to.

    Raises SourceError when the peers' history ends before ``through`` or is not contiguous, and the client's
    StatorError when no peer answers."""
    checker = PageChecker(after, f"the history of {admin.meta.url}")
    buffer: list[dict[str, Any]] = []
    if through <= after:
        return
    events = admin.iter_history(after=after, page=max(1, min(page, through - after)))
    try:
        async for e in events:
            if isinstance(e, dict) and isinstance(e.get("version"), int) and e["version"] > through:
                expected = checker.last + len(buffer) + 1
                if e["version"] != expected:  # a hole just before ``through`` is named as one, not as an early end
                    raise SourceError(f"{checker.source} has no events {expected}..{e['version'] - 1}")
                break
            buffer.append(e)
            if len(buffer) >= page or checker.last + len(buffer) >= through:
                checker.check(buffer)
                yield buffer
                buffer = []
                if checker.last >= through:
                    return
    finally:
        await events.aclose()
    checker.check(buffer)
    if buffer:
        yield buffer
    if checker.last < through:
        raise SourceError(f"the history of {admin.meta.url} ends at version {checker.last}, before {through}")


def export_events(directory: str, through: int, required: int | None = None) -> Iterator[dict[str, Any]]:
    """Stored events 1..through from the Parquet export under ``directory`` (meta/export/), in version order; an
    export that ends before ``required`` (default ``through``) is an error naming where it ends.

    The export's files cover fixed ranges of versions (``part-<first>-<last>``, one file per table and day): one
    range is read at a time, so memory holds one range (meta/export/exporter.py CHUNK_VERSIONS), not the export."""
    import pyarrow.parquet as pq

    from meta.export import schema
    if not os.path.isdir(directory):
        raise SourceError(f"no export at {directory}: not a directory")
    ranges: dict[tuple[int, int], list[str]] = {}
    for table in (schema.MAPPING, schema.LOCKS):
        for root, _dirs, files in os.walk(os.path.join(directory, table)):
            for name in files:
                m = _PART_RE.match(name)  # "_tmp-..." files of an interrupted run are not parts
                if m:
                    ranges.setdefault((int(m.group(1)), int(m.group(2))), []).append(os.path.join(root, name))
    checker = PageChecker(0, f"the export at {directory}")
    for (first, _last), paths in sorted(ranges.items()):
        if first > through:
            break
        try:
            rows = [r for p in sorted(paths) for r in pq.read_table(p).to_pylist()]
        except (OSError, ValueError) as e:
            raise SourceError(f"the export at {directory} is unreadable: {e}") from None
        try:
            events = sorted((schema.stored_event(r) for r in rows), key=lambda e: e["version"])
        except (KeyError, TypeError, ValueError) as e:
            raise SourceError(f"the export at {directory} has a malformed row: {e!r}") from None
        events = [e for e in events if e["version"] <= through]
        checker.check(events)
        yield from events
    if checker.last < (through if required is None else required):
        raise SourceError(f"the export at {directory} ends at version {checker.last}, before "
                          f"{through if required is None else required}")
