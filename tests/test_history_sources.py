"""The projection keeps every version 1..position, and the sources that fill it refuse holes and strangers.

- SqlProjection.apply refuses an event past the position (ProjectionGap names the missing versions): the
  projection's position is its contiguous-through marker, on SQLite and PostgreSQL alike;
- ``history(through=...)`` never reads past the given version (what /v1/history may serve from the projection);
- an export read back (meta/projection/sources.py export_events) gives exactly the stored events it was written
  from, in order, and names a hole or an early end instead of skipping;
- a page with a hole or a malformed event is refused by name.
"""

from __future__ import annotations

import json
import os
from collections import deque

import pytest
import sqlalchemy as sa

from meta.export import exporter
from meta.export import schema as export_schema
from meta.projection import ProjectionGap, schema
from meta.projection.sources import PageChecker, SourceError, export_events
from tests.support.pg import pg_url  # noqa: F401  (a fixture)
from tests.support.projection_backends import scenario, snapshot
from tests.support.projection_backends import new_url, projection, url  # noqa: F401  (fixtures)
from tests.support.state_machine_builders import Log


def _lock_event(version: int) -> dict:
    return {"version": version, "ts": 1_000 + version, "type": "LockGranted", "v": 1, "topic": "orders",
            "data": {"group": "g", "topic": "orders", "queue": 0, "member": "m", "token": 1}}


class TestContiguousProjection:
    def test_an_event_past_the_position_is_refused_and_changes_nothing(self, projection, url):
        events = scenario()
        assert projection.apply(events[:3]) == 3
        before = snapshot(url)
        with pytest.raises(ProjectionGap) as gap:
            projection.apply(events[5:8])
        assert (gap.value.first, gap.value.last) == (4, 5)
        with pytest.raises(ProjectionGap, match="lacks versions 6..6"):
            projection.apply([events[3], events[4], events[6]])   # a hole inside the batch
        assert snapshot(url) == before and projection.position() == 3
        assert projection.apply(events[2:8]) == 8 and projection.first_hole() is None

    def test_a_hole_left_by_older_code_is_found(self, projection, url):
        projection.apply(scenario()[:9])
        assert projection.first_hole() is None
        engine = sa.create_engine(url, poolclass=sa.NullPool)
        try:
            for gone, hole in (((3, 4), (3, 4)), ((7,), (3, 4)), ((1,), (1, 1))):
                with engine.begin() as conn:  # what a projection written before the rule could hold
                    conn.execute(sa.delete(schema.events).where(schema.events.c.version.in_(gone)))
                assert projection.first_hole() == hole
        finally:
            engine.dispose()

    def test_history_reads_no_further_than_through(self, projection):
        events = scenario()
        projection.apply(events)
        assert [e["version"] for e in projection.history(after=3, limit=100, through=7)] == [4, 5, 6, 7]
        assert projection.history(after=7, limit=100, through=7) == []
        assert [e["version"] for e in projection.history(after=0, topic="audit", limit=100, through=22)] == [22]


def _export(directory: str, events: list[dict]) -> None:
    dest = exporter.Destination(directory)
    exporter._write_chunk(dest, 1, exporter.CHUNK_VERSIONS, events)


def test_an_export_reads_back_as_the_events_it_was_written_from(tmp_path):
    events = [*scenario()[:21], _lock_event(22)]
    _export(str(tmp_path), events)
    assert list(export_events(str(tmp_path), 22)) == events
    assert list(export_events(str(tmp_path), 10)) == events[:10]
    assert [export_schema.stored_event(export_schema.row(export_schema.table_of(e), e)) for e in events] == events
    with pytest.raises(SourceError, match="ends at version 22, before 30"):
        list(export_events(str(tmp_path), 30))
    assert list(export_events(str(tmp_path), 30, required=22)) == events


def test_an_export_with_a_hole_is_named_not_skipped(tmp_path):
    events = [*scenario()[:21], _lock_event(22), {**scenario()[21], "version": 23, "ts": 1_023}]
    _export(str(tmp_path), events)
    locks = os.path.join(str(tmp_path), export_schema.LOCKS)
    for root, _dirs, files in os.walk(locks):  # lose the lock events' file: version 22
        for name in files:
            os.remove(os.path.join(root, name))
    with pytest.raises(SourceError, match="has no events 22..22"):
        list(export_events(str(tmp_path), 23))
    with pytest.raises(SourceError, match="not a directory"):
        list(export_events(str(tmp_path / "nowhere"), 1))


def test_pages_are_checked_for_holes_and_shape():
    events = scenario()
    checker = PageChecker(0, "a peer")
    checker.check(events[:3])
    checker.check(events[3:5])
    with pytest.raises(SourceError, match="a peer has no events 6..6"):
        checker.check(events[6:8])
    with pytest.raises(SourceError, match="malformed"):
        PageChecker(0, "a peer").check([{**events[0], "topic": "someone-else"}])
    with pytest.raises(SourceError, match="not a stored event"):
        PageChecker(0, "a peer").check([{"version": 1}])
    with pytest.raises(SourceError, match="time before"):
        PageChecker(0, "a peer").check([events[0], {**events[1], "ts": 0}])


def test_what_the_window_trims_goes_to_the_node_not_into_the_image():
    """The node keeps what its image's window trims until its projection has it (meta/raft/node.py): every trimmed
    version exactly once, in order, and the image's bytes are the same with or without that sink."""
    kept, plain = Log(), Log()
    kept.sm.image.trimmed_to = deque()
    for log in (kept, plain):
        log.history = 10
        log.register("a")
        log.create("t", 1)
        for i in range(40):
            log.ok({"type": "SetTopicConfig", "topic": "t", "config": {"k": str(i)}})
    data = kept.sm.image.data
    assert data["history_start"] > 10
    trimmed = list(kept.sm.image.trimmed_to)
    assert [v for v, _line in trimmed] == list(range(1, data["history_start"]))
    assert all(json.loads(line)["version"] == v for v, line in trimmed)
    assert kept.sm.image.canonical_bytes() == plain.sm.image.canonical_bytes()
