"""Retention and truncation at their bounds: a budget smaller than one file keeps the active file alone, age and
size retention in one tick count every file either deleted, a closed or failed queue is left alone, and a
truncation out of range is refused with the bounds it broke."""

from __future__ import annotations

import dataclasses

import pytest

from broker.storage import InvalidArgument, OffsetOutOfRange, PhysicalQueue, QueueConfig, limits

SMALL = QueueConfig(segment_bytes_max=1024, index_interval_bytes=64, index_interval_records=3)


def _filled(tmp_path, config: QueueConfig, files: int, ts_ms=lambda i: 1_000) -> PhysicalQueue:
    q = PhysicalQueue.create(str(tmp_path / "q"), 0, config)
    i = 0
    while q.segment_count < files:
        q.append([b"r%04d" % i + b"." * 90], ts_ms(i))
        i += 1
    return q


def test_a_size_budget_below_one_file_keeps_the_active_file_alone(tmp_path):
    q = _filled(tmp_path, dataclasses.replace(SMALL, retention_bytes=10), 6)
    active_base = q._bases[-1]
    assert q.apply_retention(10**6) == 5
    assert q.segment_count == 1 and q.min_offset == active_base
    assert q.apply_retention(10**6) == 0   # the active file is never retention's
    q.close()


def test_a_size_budget_that_fits_the_newest_files_keeps_exactly_them(tmp_path):
    q = _filled(tmp_path, SMALL, 6)
    sizes = [s.file_bytes for s in q._segments]
    q.close()
    for keep in (3, 2, 1):   # each run deletes, so from the most kept down
        budget = sum(sizes[-keep:])
        with PhysicalQueue.open(str(tmp_path / "q"), dataclasses.replace(SMALL, retention_bytes=budget)) as q:
            before = q.segment_count
            assert before > keep and q.apply_retention(10**6) == before - keep
            assert q.segment_count == keep and q.size_bytes == budget


def test_age_and_size_retention_in_one_tick_count_every_file_deleted(tmp_path):
    config = dataclasses.replace(SMALL, retention_ms=1_000)
    q = _filled(tmp_path, config, 8, ts_ms=lambda i: 1_000 + i)   # record i stamped 1,000 + i
    cut, budget = q._bases[2], sum(s.file_bytes for s in q._segments[-3:])
    q.close()
    # Age: the first two files hold only records older than now - retention_ms; size: then down to three files
    now = 1_000 + cut + 1_000
    with PhysicalQueue.open(str(tmp_path / "q"), dataclasses.replace(config, retention_bytes=budget)) as q:
        assert q.apply_retention(now) == 5
        assert q.segment_count == 3


def test_a_closed_or_failed_queue_is_left_alone_by_retention(tmp_path):
    config = dataclasses.replace(SMALL, retention_bytes=10)
    q = _filled(tmp_path, config, 4)
    q.sync_failed()
    assert q.apply_retention(10**6) == 0 and q.segment_count == 4
    q.close()
    assert q.apply_retention(10**6) == 0


def test_a_truncation_out_of_range_is_refused_with_its_bounds(tmp_path):
    q = _filled(tmp_path, SMALL, 3)
    q.truncate_before(q._bases[1])
    end = q.max_offset
    with pytest.raises(OffsetOutOfRange) as e:
        q.truncate_before(end + 1)
    assert e.value.message == "cannot truncate past the end of the queue"
    assert e.value.details == {"offset": end + 1, "min_offset": q.min_offset, "max_offset": end}
    for bad in (-1, limits.OFFSET_MAX + 1, "3"):
        with pytest.raises(InvalidArgument) as e:
            q.truncate_before(bad)
        assert e.value.message == f"offset must be an integer in [0, {limits.OFFSET_MAX}]"
        assert e.value.details == {"offset": bad}
    q.close()
