"""offset_for_time against a plain model: the first offset stamped at or after a time, found through a sparse
index (several frames between two entries, so the scan between them decides), across plateaus of equal stamps,
a clock that steps back, rolls, and a reopen that rebuilds the index."""

from __future__ import annotations

import random

import pytest

from broker.storage import InvalidArgument, PhysicalQueue, QueueConfig, limits
from broker.storage.index import SparseIndex
from tests.support.storage_payloads import payload

# Frames of one small record (~40 bytes with their header): an index entry every ~8 frames, a file every ~60.
SPARSE = QueueConfig(segment_bytes_max=2_400, index_interval_bytes=320, index_interval_records=50)


def _model_answer(stamps: list[tuple[int, int]], t: int, end: int) -> int:
    return next((offset for offset, ts in stamps if ts >= t), end)


def _fill(q: PhysicalQueue, seed: int, frames: int) -> list[tuple[int, int]]:
    """Appends ``frames`` frames of one or two records; returns (offset, stamp stored) of every record. Stamps
    rise in plateaus (several frames at one time) with jumps, and now and then the clock steps back."""
    rnd = random.Random(seed)
    stamps, clock, stored = [], 1_000, 0
    for _ in range(frames):
        roll = rnd.random()
        if roll < 0.5:
            pass                       # a plateau: the same stamp again
        elif roll < 0.9:
            clock += rnd.randint(1, 7)
        else:
            clock -= rnd.randint(1, 20)  # stepped back: stored as the last stamp
        n = rnd.randint(1, 2)
        first = q.append([payload(q.max_offset + j) for j in range(n)], clock)
        stored = max(stored, clock)
        stamps.extend((first + j, stored) for j in range(n))
    return stamps


def _check_every_time(q: PhysicalQueue, stamps: list[tuple[int, int]]) -> None:
    times = sorted({ts for _, ts in stamps})
    probes = {times[0] - 5, times[-1] + 1, 0, limits.TS_MS_MAX}
    for ts in times:
        probes.update((ts - 1, ts, ts + 1))
    for t in sorted(probes):
        assert q.offset_for_time(t) == _model_answer(stamps, t, q.max_offset), t


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_first_offset_at_or_after_a_time_is_found_between_sparse_index_entries(tmp_path, seed):
    path = str(tmp_path / "q")
    q = PhysicalQueue.create(path, 50, SPARSE)
    stamps = _fill(q, seed, 400)
    assert q.segment_count >= 5
    # The index must leave several frames between entries, or every answer would be an entry's own offset
    first = q._segments[0]
    assert first.index.rels and len(first.index.rels) * 3 < first.end_offset - first.base
    _check_every_time(q, stamps)
    q.close()
    with PhysicalQueue.open(path, SPARSE) as q:   # a clean reopen: the stored index
        _check_every_time(q, stamps)
    # An unclean reopen (no clean marker): each file's index is rebuilt by its scan
    (tmp_path / "q" / "clean-shutdown.json").unlink()
    for index in (tmp_path / "q").glob("*.index"):
        index.unlink()
    with PhysicalQueue.open(path, SPARSE) as q:
        _check_every_time(q, stamps)


def test_an_empty_queue_and_a_time_past_every_record_answer_the_end(tmp_path):
    q = PhysicalQueue.create(str(tmp_path / "q"), 7, SPARSE)
    assert q.offset_for_time(0) == 7
    q.append([b"a", b"b"], 100)
    assert q.offset_for_time(100) == 7
    assert q.offset_for_time(101) == 9
    assert q.offset_for_time(-limits.TS_MS_MAX) == 7
    q.close()


def test_a_time_out_of_range_is_refused_naming_ts_ms(tmp_path):
    q = PhysicalQueue.create(str(tmp_path / "q"), 0, SPARSE)
    for bad in (limits.TS_MS_MAX + 1, -limits.TS_MS_MAX - 1, 1.5, "1"):
        with pytest.raises(InvalidArgument) as e:
            q.offset_for_time(bad)
        assert e.value.message == f"ts_ms must be an integer in [{-limits.TS_MS_MAX}, {limits.TS_MS_MAX}]"
        assert e.value.details == {"ts_ms": bad}
    q.close()


def test_the_index_span_before_a_time_names_the_last_entry_before_it_and_the_next_one():
    index = SparseIndex(interval_bytes=1, interval_records=1)
    for rel, pos, ts in ((0, 0, 10), (5, 100, 20), (9, 180, 20), (14, 260, 30)):
        index.add_frame(rel, pos, ts)
    assert index.span_before_time(5) == (-1, 0, None, None)
    assert index.span_before_time(10) == (-1, 0, None, None)
    assert index.span_before_time(11) == (0, 0, 5, 100)
    assert index.span_before_time(20) == (0, 0, 5, 100)
    assert index.span_before_time(21) == (2, 180, 14, 260)
    assert index.span_before_time(30) == (2, 180, 14, 260)
    assert index.span_before_time(31) == (3, 260, None, None)
