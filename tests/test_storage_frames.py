"""The frame layer of physical queue storage (broker/storage/record.py): one frame per append, laid out as documented;
read_runs handing back whole frames untouched and the wanted part of a frame when a read starts or stops inside it;
sequential reads that stop inside a frame and go on from there (the segment's read hint); the owner's tag;
append_records refusing records that are not exactly `count` sized records, leaving the queue as it was; time lookups
across frames; and random batches and reads against a plain list model.

Expected runs come from ``Model.runs``, written from the contract (records from the offset on, at most max_records of
them and max_bytes of payload but at least one, grouped by the frame they were appended in), not from the storage
code. Frames are built by tests/support/storage_payloads.py from the documented layout.
"""

from __future__ import annotations

import os
import random
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.storage import (BatchTooLarge, InvalidArgument, PhysicalQueue, ProducerMark, QueueConfig, Record,
                            RecordTooLarge, Run, files, limits)
from broker.storage.record import HEADER_BYTES, SIZE, SIZE_BYTES, frame_bytes_at
from tests.support.storage_payloads import encode_frame, framed_records, payloads

# One file, the sparse index of a real queue's proportions (a read starting between entries skips frames).
ONE_FILE = QueueConfig(segment_bytes_max=1 << 20, index_interval_bytes=256, index_interval_records=8,
                       flush_policy="interval")
# Small files and a dense index: rolls and reads across files.
SMALL = QueueConfig(segment_bytes_max=1024, index_interval_bytes=64, index_interval_records=3,
                    flush_policy="interval")
# An index entry for the first frame only: every read but the first file's first starts by skipping frames, and a
# sequential reader leans on the read hint.
SPARSE = QueueConfig(segment_bytes_max=1 << 20, index_interval_bytes=limits.INDEX_INTERVAL_BYTES_MAX,
                     index_interval_records=limits.INDEX_INTERVAL_RECORDS_MAX, flush_policy="interval")


@dataclass
class Frame:
    first: int
    ts_ms: int
    tag: int
    items: list[bytes]


@dataclass
class Model:
    """What the queue holds: its frames, in order, with the timestamps storage keeps (never decreasing)."""
    start: int = 0
    frames: list[Frame] = field(default_factory=list)

    @property
    def end(self) -> int:
        return self.frames[-1].first + len(self.frames[-1].items) if self.frames else self.start

    def append(self, items: list[bytes], ts_ms: int, tag: int = 0) -> int:
        last = self.frames[-1].ts_ms if self.frames else 0
        self.frames.append(Frame(self.end, max(ts_ms, last), tag, list(items)))
        return self.frames[-1].first

    def runs(self, offset: int, max_records: int = limits.READ_RECORDS_DEFAULT,
             max_bytes: int = limits.READ_BYTES_DEFAULT) -> list[Run]:
        out: list[Run] = []
        taken, budget = 0, max_bytes
        for frame in self.frames:
            skip = max(0, offset - frame.first)
            if skip >= len(frame.items):
                continue
            got: list[bytes] = []
            for item in frame.items[skip:]:
                if taken == max_records or (taken and len(item) > budget):
                    break
                got.append(item)
                taken += 1
                budget -= len(item)
            if got:
                out.append(Run(frame.first + skip, frame.ts_ms, len(got), frame.tag, framed_records(got)))
            if skip + len(got) < len(frame.items):
                break
        return out

    def records(self, offset: int, max_records: int = limits.READ_RECORDS_DEFAULT,
                max_bytes: int = limits.READ_BYTES_DEFAULT) -> list[Record]:
        out: list[Record] = []
        for run in self.runs(offset, max_records, max_bytes):
            frame = self.frame_of(run.offset)
            skip = run.offset - frame.first
            kept = frame.items[skip:skip + run.count]
            out += [Record(run.offset + i, run.ts_ms, item) for i, item in enumerate(kept)]
        return out

    def frame_of(self, offset: int) -> Frame:
        return next(f for f in self.frames if f.first <= offset < f.first + len(f.items))

    def offset_for_time(self, ts_ms: int) -> int:
        return next((f.first for f in self.frames if f.ts_ms >= ts_ms), self.end)


def check_reads(q: PhysicalQueue, model: Model, offset: int, max_records: int, max_bytes: int) -> list[Run]:
    runs = q.read_runs(offset, max_records, max_bytes)
    assert runs == model.runs(offset, max_records, max_bytes), (offset, max_records, max_bytes)
    assert q.read(offset, max_records, max_bytes) == model.records(offset, max_records, max_bytes)
    return runs


def log_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.glob("*.log"))


def varied_batches(seed: int, batches: int, most: int = 9) -> list[list[bytes]]:
    """Batches of 1 to `most` records of 0 to 120 bytes (some empty), each byte telling where it came from."""
    rng = random.Random(seed)
    out = []
    for b in range(batches):
        out.append([bytes([b % 251, i]) * rng.randrange(0, 61) for i in range(rng.randrange(1, most + 1))])
    return out


# One frame per append.

def test_each_append_writes_one_frame_laid_out_as_documented(tmp_path):
    path = tmp_path / "q"
    q = PhysicalQueue.create(str(path), 5, ONE_FILE)
    log = path / files.log_name(5)
    expected = b""
    for i, items in enumerate(varied_batches(1, 30)):
        ts, tag = 1_000 + 7 * i, (i * 2_654_435_761) % 2**32
        first = q.max_offset
        if i % 2:
            assert q.append_records(framed_records(items), len(items), ts, tag) == first
        else:
            assert q.append(items, ts, tag) == first
        expected += encode_frame(items, first, ts, tag)
        assert log.stat().st_size == len(expected)
        assert q.size_bytes == len(expected)
    assert log.stat().st_size == sum(HEADER_BYTES + SIZE_BYTES * len(b) + sum(map(len, b))
                                     for b in varied_batches(1, 30))
    assert log.read_bytes() == expected  # header fields, CRC-32C coverage and records, as record.py describes them
    q.close()


def test_frame_size_is_header_plus_a_size_per_record_plus_payload(tmp_path):
    path = tmp_path / "q"
    q = PhysicalQueue.create(str(path), 0, ONE_FILE)
    before = 0
    for count, size in ((1, 0), (1, 1), (3, 0), (7, 13), (20, 300), (1, 5_000)):
        q.append([b"p" * size] * count, 1)
        after = (path / files.log_name(0)).stat().st_size
        assert after - before == HEADER_BYTES + SIZE_BYTES * count + count * size
        before = after
    q.close()


# Runs: whole frames untouched, trimmed where a read starts or stops inside one.

def _appended(q: PhysicalQueue, model: Model, batches: list[list[bytes]], ts0: int = 1_000) -> list[bytes]:
    """Appends each batch through append_records, as the broker forwards a producer's records; returns them framed."""
    sent = []
    for i, items in enumerate(batches):
        records = framed_records(items)
        first = q.append_records(records, len(items), ts0 + i, tag=100 + i)
        assert first == model.append(items, ts0 + i, 100 + i)
        sent.append(records)
    return sent


def test_whole_frames_come_back_untouched(tmp_path):
    q = PhysicalQueue.create(str(tmp_path / "q"), 0, ONE_FILE)
    model = Model()
    batches = [payloads(0, 4), payloads(4, 1), payloads(5, 6), payloads(11, 3)]
    sent = _appended(q, model, batches)
    firsts = [0, 4, 5, 11]
    whole = [Run(first, 1_000 + i, len(b), 100 + i, sent[i]) for i, (first, b) in enumerate(zip(firsts, batches))]
    assert q.read_runs(0) == whole
    for i, first in enumerate(firsts):
        assert q.read_runs(first) == whole[i:]
        # max_records ending exactly at a frame's end: whole frames still, and no empty run after them
        assert q.read_runs(first, sum(len(b) for b in batches[i:i + 2])) == whole[i:i + 2]
    for run, records in zip(q.read_runs(0), sent):
        assert run.records == records and run.payload_bytes == len(records) - SIZE_BYTES * run.count
    q.close()
    with PhysicalQueue.open(str(tmp_path / "q"), ONE_FILE) as q:
        assert q.read_runs(0) == whole


def test_runs_are_trimmed_where_a_read_starts_or_stops_inside_a_frame(tmp_path):
    q = PhysicalQueue.create(str(tmp_path / "q"), 0, ONE_FILE)
    model = Model()
    ten = [bytes([i]) * 10 for i in range(5)]
    _appended(q, model, [ten, [b"A" * 10] * 4, [b"B" * 300, b"c", b"d"]])   # offsets 0-4, 5-8, 9-11
    cases = [
        (2, 100, 10_000),   # starts inside the first frame: its tail, then whole frames
        (0, 3, 10_000),     # stops inside the first frame by max_records
        (3, 4, 10_000),     # starts inside one frame, stops inside the next
        (0, 100, 25),       # stops inside the first frame by max_bytes (two records of 10 fit in 25)
        (0, 100, 50),       # the first frame exactly, then nothing: 10 more bytes would not fit
        (0, 100, 60),       # the first frame whole and one record of the second
        (4, 100, 15),       # one record, then the next frame's first does not fit
        (9, 100, 1),        # a record past the byte budget: still one, as the first of the read
        (8, 100, 10),       # one record fits the budget; the next frame's 300 bytes do not
        (10, 1, 1),         # starts inside the last frame, one record
        (11, 100, 1),       # the very last record
    ]
    for offset, max_records, max_bytes in cases:
        runs = check_reads(q, model, offset, max_records, max_bytes)
        assert runs and runs[0].offset == offset
    assert q.read_runs(0, 3) == [Run(0, 1_000, 3, 100, framed_records(ten[:3]))]
    assert q.read_runs(3, 4) == [Run(3, 1_000, 2, 100, framed_records(ten[3:])),
                                 Run(5, 1_001, 2, 101, framed_records([b"A" * 10] * 2))]
    assert q.read_runs(0, 100, 25) == [Run(0, 1_000, 2, 100, framed_records(ten[:2]))]
    assert q.read_runs(9, 100, 1) == [Run(9, 1_002, 1, 102, framed_records([b"B" * 300]))]
    q.close()


@pytest.mark.parametrize("config", [ONE_FILE, SMALL, SPARSE], ids=["one-file", "small", "sparse-index"])
def test_sequential_reads_that_stop_inside_frames_go_on_correctly(tmp_path, config):
    """Every offset read in order, and every range walked reading on from where the last read stopped, with record
    and byte limits that stop reads inside frames; then the same backwards and after reopening (clean and not)."""
    path = tmp_path / "q"
    q = PhysicalQueue.create(str(path), 3, config)
    model = Model(start=3)
    _appended(q, model, varied_batches(2, 40))
    end = model.end
    for reopen in (None, "clean", "crashed"):
        if reopen:
            q.close()
            if reopen == "crashed":
                (path / files.CLEAN_MARKER).unlink()
            q = PhysicalQueue.open(str(path), config)
        assert q.max_offset == end
        for max_records in (1, 2, 3, 5, 8, 13):
            for offset in range(3, end):
                check_reads(q, model, offset, max_records, limits.READ_BYTES_DEFAULT)
            for offset in reversed(range(3, end)):
                check_reads(q, model, offset, max_records, 40)
            for max_bytes in (1, 30, 75, 10_000):
                offset, seen = 3, []
                while offset < end:
                    runs = check_reads(q, model, offset, max_records, max_bytes)
                    assert runs, f"no progress at {offset}"
                    seen.extend(r.offset + i for r in runs for i in range(r.count))
                    offset = runs[-1].offset + runs[-1].count
                assert seen == list(range(3, end))
    q.close()


# The tag.

def test_the_tag_comes_back_with_every_run_of_its_frame(tmp_path):
    path = tmp_path / "q"
    q = PhysicalQueue.create(str(path), 0, SMALL)
    model = Model()
    for i, tag in enumerate((0, 1, 7, 2**31, 2**32 - 1, 0xDEADBEEF, 0)):
        items = payloads(model.end, 1 + i % 4)
        if i % 2:
            assert q.append(items, 10, tag) == model.append(items, 10, tag)
        else:
            assert q.append_records(framed_records(items), len(items), 10, tag) == model.append(items, 10, tag)
    size = q.size_bytes
    for bad in (-1, 2**32, 1.5, "1", None):
        with pytest.raises(InvalidArgument):
            q.append([b"x"], 10, bad)
        with pytest.raises(InvalidArgument):
            q.append_records(framed_records([b"x"]), 1, 10, bad)
    assert (q.max_offset, q.size_bytes) == (model.end, size)
    for offset in range(model.end):
        for max_records in (1, 2, 100):
            runs = check_reads(q, model, offset, max_records, limits.READ_BYTES_DEFAULT)
            assert all(run.tag == model.frame_of(run.offset).tag for run in runs)
    q.close()
    (path / files.CLEAN_MARKER).unlink()
    with PhysicalQueue.open(str(path), SMALL) as q:
        assert [run.tag for run in q.read_runs(0)] == [f.tag for f in model.frames]


def test_a_recovery_hands_back_the_producer_marks_of_the_last_frames_and_a_clean_open_none(tmp_path, monkeypatch):
    """A frame's mark (record.py: the idempotent producer's batch it holds) is the header's last three fields, the
    producer stored + 1 so that producer 0 is one; an open that recovers the active file hands back the marks of
    its last frames, once (the broker's producers.log may have lost their lines: broker/writes.py)."""
    path = tmp_path / "q"
    q = PhysicalQueue.create(str(path), 0, ONE_FILE)
    expected, layout = [], b""
    for i in range(6):
        items = payloads(3 * i, 3)
        mark = None if i == 3 else ProducerMark((2**63 - 1) if i % 2 else 0, 100 + i, 5_000 + 3 * i)
        first = q.append_records(framed_records(items), 3, 10, 0, mark=mark)
        layout += encode_frame(items, first, 10, mark=(0, 0, 0) if mark is None else (mark.producer + 1, *mark[1:]))
        if mark is not None:
            expected.append((first, 3, mark))
    assert (path / files.log_name(0)).read_bytes() == layout
    q.close()
    with PhysicalQueue.open(str(path), ONE_FILE) as clean:
        assert clean.take_recovered_marks() == [], "a queue closed cleanly is not walked: nothing to hand back"
    (path / files.CLEAN_MARKER).unlink()   # as after a crash
    with PhysicalQueue.open(str(path), ONE_FILE) as recovered:
        assert recovered.take_recovered_marks() == expected
        assert recovered.take_recovered_marks() == [], "handed back once"
    (path / files.CLEAN_MARKER).unlink()
    monkeypatch.setattr(limits, "RECOVERED_MARKS_MAX", 2)
    with PhysicalQueue.open(str(path), ONE_FILE) as bounded:
        assert bounded.take_recovered_marks() == expected[-2:], "only the last RECOVERED_MARKS_MAX"


# append_records refuses what is not exactly `count` sized records.

def _bad_records() -> dict[str, tuple[object, int, type]]:
    good = framed_records([b"alpha", b"", b"gamma"])
    big = limits.RECORD_BYTES_MAX + 1
    return {
        "short by a byte": (good[:-1], 3, InvalidArgument),
        "a whole record short": (framed_records([b"alpha", b""]), 3, InvalidArgument),
        "a byte too long": (good + b"\0", 3, InvalidArgument),
        "half a size after the records": (good + SIZE.pack(0)[:2], 3, InvalidArgument),
        "an extra record": (good + SIZE.pack(0), 3, InvalidArgument),
        "count one too high": (good, 4, InvalidArgument),
        "count one too low": (good, 2, InvalidArgument),
        "a size past the records": (SIZE.pack(100) + b"x" * 10, 1, InvalidArgument),
        "a size past RECORD_BYTES_MAX": (SIZE.pack(big) + bytes(big), 1, InvalidArgument),
        "a lying size past RECORD_BYTES_MAX": (SIZE.pack(big) + b"x" * 10, 1, InvalidArgument),
        "nothing": (b"", 1, InvalidArgument),
        "count zero": (b"", 0, BatchTooLarge),
        "count past BATCH_RECORDS_MAX": (SIZE.pack(0) * (limits.BATCH_RECORDS_MAX + 1),
                                         limits.BATCH_RECORDS_MAX + 1, BatchTooLarge),
        "not bytes: bytearray": (bytearray(good), 3, InvalidArgument),
        "not bytes: memoryview": (memoryview(good), 3, InvalidArgument),
        "not bytes: str": ("\x05\x00\x00\x00alpha", 1, InvalidArgument),
        "not bytes: list": ([b"alpha"], 1, InvalidArgument),
    }


def test_append_records_refuses_records_that_are_not_count_sized_records(tmp_path):
    path = tmp_path / "q"
    q = PhysicalQueue.create(str(path), 0, ONE_FILE)
    model = Model()
    _appended(q, model, [payloads(0, 3), payloads(3, 2)])
    for name, (records, count, error) in _bad_records().items():
        before = (q.max_offset, q.size_bytes, log_bytes(path))
        with pytest.raises(error):
            q.append_records(records, count, 5_000)
        assert (q.max_offset, q.size_bytes, log_bytes(path)) == before, name
        assert not q.failed, name
    assert q.read_runs(0) == model.runs(0)
    # The queue goes on: the next frame lands right after the last good one.
    _appended(q, model, [[b""] * 3, [b"x" * limits.RECORD_BYTES_MAX]], ts0=6_000)  # the limits themselves pass
    for offset in (0, model.end - 1):
        assert q.read_runs(offset) == model.runs(offset)
    q.close()
    (path / files.CLEAN_MARKER).unlink()
    with PhysicalQueue.open(str(path), ONE_FILE) as q:
        assert q.max_offset == model.end
        for offset in (0, model.end - 1):
            assert q.read_runs(offset) == model.runs(offset)


def test_a_framed_batch_is_bounded_by_its_payload_bytes_not_its_framing(tmp_path):
    """BATCH_BYTES_MAX counts the records' bytes, as append() does: the sizes framing them are not counted."""
    path = tmp_path / "q"
    with PhysicalQueue.create(str(path), 0, ONE_FILE) as q:
        whole = [b"x" * limits.RECORD_BYTES_MAX] * (limits.BATCH_BYTES_MAX // limits.RECORD_BYTES_MAX)
        assert sum(map(len, whole)) == limits.BATCH_BYTES_MAX
        assert q.append_records(framed_records(whole), len(whole), 1) == 0
        with pytest.raises(BatchTooLarge) as refused:
            over = [*whole[1:], b"y" * (limits.RECORD_BYTES_MAX - 1), b"zz"]
            q.append_records(framed_records(over), len(over), 2)
        assert refused.value.details == {"batch_bytes": limits.BATCH_BYTES_MAX + 1}
        with pytest.raises(InvalidArgument) as refused:
            q.append_records(bytearray(framed_records([b"a"])), 1, 3)
        assert (refused.value.message, refused.value.details) == ("records must be bytes", {"type": "bytearray"})
        assert q.max_offset == len(whole)


def test_refusals_of_payloads_and_framed_records_say_what_and_how_much(tmp_path):
    """Each refusal names its cause and carries the numbers an API error passes on (storage errors map to HTTP by
    code and details, never by parsing their text)."""
    with PhysicalQueue.create(str(tmp_path / "q"), 0, ONE_FILE) as q:
        assert q.append([bytearray(b"ab"), b"c"], 1) == 0    # a bytearray is bytes enough
        for payload, kind in ((memoryview(b"x"), "memoryview"), ("x", "str")):
            with pytest.raises(InvalidArgument) as refused:
                q.append([b"ok", payload], 1)
            assert (refused.value.message, refused.value.details) == ("payloads must be bytes", {"type": kind})
        big = limits.RECORD_BYTES_MAX + 1
        with pytest.raises(RecordTooLarge) as refused:
            q.append_records(SIZE.pack(0) + SIZE.pack(big) + bytes(big), 2, 1)
        assert (refused.value.message, refused.value.details) == (
            f"a record holds at most {limits.RECORD_BYTES_MAX} bytes", {"record_bytes": big})
        with pytest.raises(InvalidArgument) as refused:
            q.append_records(framed_records([b"a", b"b"]) + b"\0", 2, 1)
        assert refused.value.message == "records must be 2 records, each behind its u32 size, and nothing else"
        assert q.max_offset == 2
        assert [r.payload for r in q.read(0)] == [b"ab", b"c"]


def test_append_refuses_a_record_past_the_limit_and_leaves_nothing(tmp_path):
    path = tmp_path / "q"
    q = PhysicalQueue.create(str(path), 0, ONE_FILE)
    q.append([b"a"], 1)
    with pytest.raises(RecordTooLarge):
        q.append([b"ok", b"x" * (limits.RECORD_BYTES_MAX + 1)], 1)
    with pytest.raises(BatchTooLarge):
        q.append_records(framed_records([b"x" * limits.RECORD_BYTES_MAX] * 5), 5, 1)
    assert (q.max_offset, log_bytes(path)) == (1, HEADER_BYTES + SIZE_BYTES + 1)
    q.close()


# Time.

def test_offset_for_time_across_frames(tmp_path):
    path = tmp_path / "q"
    q = PhysicalQueue.create(str(path), 50, SMALL)
    model = Model(start=50)
    stamps = [1_000, 1_000, 1_010, 1_005, 1_030, 1_030, 1_031, 900, 1_100, 1_200, 1_200, 1_350]
    for i, ts in enumerate(stamps * 3):
        ts += 1_000 * (i // len(stamps))
        items = payloads(model.end, 1 + i % 5)
        assert q.append(items, ts, tag=i) == model.append(items, ts, i)
    assert q.segment_count > 3
    times = sorted({f.ts_ms for f in model.frames})
    probes = {t + d for t in times for d in (-1, 0, 1)} | {0, 10**12}
    for reopen in (None, "clean", "crashed"):
        if reopen:
            q.close()
            if reopen == "crashed":   # every index rebuilt from the frames by scanning
                (path / files.CLEAN_MARKER).unlink()
                for index in path.glob("*.index"):
                    index.unlink()
            q = PhysicalQueue.open(str(path), SMALL)
        for t in sorted(probes):
            assert q.offset_for_time(t) == model.offset_for_time(t), (reopen, t)
        assert [(r.offset, r.ts_ms) for r in q.read_runs(50, limits.READ_RECORDS_MAX)] == \
            [(r.offset, r.ts_ms) for r in model.runs(50, limits.READ_RECORDS_MAX)]
    q.close()


# Random batches and reads against the model.

append_step = st.tuples(st.just("append"), st.lists(st.binary(max_size=300), min_size=1, max_size=20),
                        st.integers(0, 2**32 - 1), st.integers(0, 5_000), st.booleans())
read_step = st.tuples(st.just("read"), st.floats(0, 1), st.integers(1, 30), st.integers(1, 3_000))
reopen_step = st.tuples(st.just("reopen"), st.booleans())
steps = st.lists(st.one_of(append_step, append_step, read_step, read_step, read_step, reopen_step),
                 min_size=1, max_size=30)
CONFIGS = [QueueConfig(segment_bytes_max=4096, index_interval_bytes=512, index_interval_records=16,
                       flush_policy="interval"), ONE_FILE]


@settings(deadline=None, max_examples=60, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=steps, start=st.sampled_from([0, 1, 10**6]), config=st.sampled_from(CONFIGS))
def test_random_batches_and_reads_against_a_list_model(plan, start, config):
    with tempfile.TemporaryDirectory(prefix="stator-frames-") as d:
        path = os.path.join(d, "q")
        q = PhysicalQueue.create(path, start, config)
        model = Model(start=start)
        try:
            for step in plan:
                if step[0] == "append":
                    _, items, tag, ts, framed = step
                    if framed:
                        first = q.append_records(framed_records(items), len(items), ts, tag)
                    else:
                        first = q.append(items, ts, tag)
                    assert first == model.append(items, ts, tag)
                elif step[0] == "read":
                    _, where, max_records, max_bytes = step
                    offset = start + int(where * (model.end - start + 1))
                    check_reads(q, model, offset, max_records, max_bytes)
                else:
                    q.close()
                    if step[1]:
                        os.unlink(os.path.join(path, files.CLEAN_MARKER))
                    q = PhysicalQueue.open(path, config)
                assert q.max_offset == model.end
            offset = start
            while offset < model.end:   # and the whole queue, read on from each stop
                runs = check_reads(q, model, offset, 7, 500)
                offset = runs[-1].offset + runs[-1].count
        finally:
            q.close()


def test_a_store_refuses_queues_of_another_storage_format_by_name(tmp_path):
    from broker.storage import QueueStore, UnsupportedFormat
    from broker.storage.store import FORMAT_FILE
    root = tmp_path / "queues"
    store = QueueStore(str(root))
    store.create("a.q0").append([b"x"], 1)
    store.close()
    assert (root / FORMAT_FILE).read_bytes() == b"stator-queues 3\n"
    QueueStore(str(root)).close()   # its own format opens
    for other in (b"stator-queues 2\n", b"stator-queues 4\n"):   # 2: frames without their producer mark
        (root / FORMAT_FILE).write_bytes(other)
        with pytest.raises(UnsupportedFormat, match=f"storage format {other!r}"[:-3]):
            QueueStore(str(root))
    (root / FORMAT_FILE).unlink()   # format 1 wrote no file: its queues are refused, not read as damaged and cut
    size = sum(f.stat().st_size for f in root.rglob("*.log"))
    with pytest.raises(UnsupportedFormat, match="storage format 1") as refused:
        QueueStore(str(root))
    assert refused.value.code == "UNSUPPORTED_FORMAT" and sum(f.stat().st_size for f in root.rglob("*.log")) == size
    assert refused.value.details == {"path": str(root), "version": 1, "supported": [3]}
    assert refused.value.message == (f"{root}: 1 queues and no .format file: storage format 1 (a header per record); "
                                     "this build reads format 3, and Stator keeps no upgrade path before 1.0: start "
                                     "on an empty directory")
    QueueStore(str(tmp_path / "empty")).close()   # a root with no queues takes this build's format
    assert (tmp_path / "empty" / FORMAT_FILE).exists()


@pytest.mark.parametrize("junk", [b"\xffstator-queues 3\n", "stator-queues \u00b3\n".encode(), b"stator-queues 3 4\n",
                                  b"stator-queues-3\n" + b"x" * 100])
def test_a_format_file_of_junk_is_refused_by_name_never_with_a_decoding_error(tmp_path, junk):
    from broker.storage import QueueStore, UnsupportedFormat
    from broker.storage.store import FORMAT_FILE
    root = tmp_path / "queues"
    QueueStore(str(root)).close()
    (root / FORMAT_FILE).write_bytes(junk)
    with pytest.raises(UnsupportedFormat) as refused:
        QueueStore(str(root))
    assert refused.value.details == {"path": str(root / FORMAT_FILE), "supported": [3]}
    assert refused.value.message == (f"{root / FORMAT_FILE}: storage format {junk[:40]!r}; this build reads "
                                     "'stator-queues 3', and Stator keeps no upgrade path before 1.0")


def test_the_bytes_a_frame_occupies_are_read_from_its_header_where_it_starts():
    first = encode_frame(payloads(0, 2), 0, 1)
    second = encode_frame(payloads(2, 5), 2, 1)
    buf = first + second
    assert frame_bytes_at(buf, 0) == len(first)
    assert frame_bytes_at(buf, len(first)) == len(second)
    # A header cut short tells nothing: a header's worth, wherever the cut falls
    assert frame_bytes_at(buf[:len(first) + HEADER_BYTES - 1], len(first)) == HEADER_BYTES
    # Exactly a header left: its length is read
    assert frame_bytes_at(buf[:len(first) + HEADER_BYTES], len(first)) == len(second)
    # A length past any frame's bound is taken at the bound: a damaged header never asks for more
    huge = bytearray(second)
    huge[0:4] = SIZE.pack(0xFFFFFFFF)
    assert frame_bytes_at(bytes(huge), 0) == HEADER_BYTES + limits.FRAME_BYTES_MAX
