"""What a leader sends the brokers that copy from it (broker/replication/source.py, frames.py): the follower's binary
positions, and the runs a stream sends from memory, which must be exactly the runs the leader's file holds."""

from __future__ import annotations

import struct
from types import SimpleNamespace

import pytest

from broker.replication import frames, source
from broker.replication.source import FetchSource, _Stream
from broker.storage import QueueStore
from broker.storage.record import pack_records
from broker.writes import stored_run

PQ = "orders.q0.g0"


# -- the follower's positions ---------------------------------------------------------------------------------------
def test_positions_go_and_come_back_whole():
    sent = [frames.Position(PQ, 10, 12), frames.Position("é" * 127, 0, 2**62)]
    for full in (True, False):
        assert frames.decode_positions(frames.encode_positions(sent, full)) == (sent, full)
    assert frames.decode_positions(frames.encode_positions([], True)) == ([], True)


def _one(name: bytes, offset: int = 1, written: int = 2, flags: int = 0, count: int = 1) -> bytes:
    return frames.FLAGS.pack(flags, count) + frames.NAME.pack(len(name)) + name + frames.POSITION.pack(offset, written)


@pytest.mark.parametrize("body, why", [
    (b"", "empty"),
    (_one(b"q")[:-1], "cut short"),
    (_one(b"q") + b"x", "a byte after the last position"),
    (_one(b"q", flags=2), "flags other than full"),
    (frames.FLAGS.pack(0, frames.POSITIONS_MAX + 1), "more queues than a stream names"),
    (_one(b"q", count=2), "fewer queues than counted"),
    (_one(b""), "an empty name"),
    (_one(b"q" * (frames.NAME_BYTES_MAX + 1)), "too long a name"),
    (_one(b"\xff\xfe"), "a name that is not UTF-8"),
    (_one(b"q", offset=3, written=2), "held durably past what it wrote"),
    (_one(b"q", offset=0, written=frames.OFFSET_MAX + 1), "an offset past the largest"),
])
def test_positions_that_are_not_one_whole_message_are_refused(body, why):
    with pytest.raises(frames.FramesError):
        frames.decode_positions(body)


def test_the_largest_positions_message_fits_the_streams_bound():
    most = [frames.Position("q" * frames.NAME_BYTES_MAX, 2**62, 2**62)] * frames.POSITIONS_MAX
    assert len(frames.encode_positions(most, True)) == frames.POSITIONS_BYTES_MAX


# -- the runs kept in memory -------------------------------------------------------------------------------------
def _source(store: QueueStore) -> FetchSource:
    writer = SimpleNamespace(store=store, replicas=SimpleNamespace())
    routes = SimpleNamespace(hosted={}, held=lambda pq: None)
    return FetchSource("b1", routes, writer)


def _follow(src: FetchSource, follower: str, at: int) -> _Stream:
    stream = _Stream(ws=None, follower=follower, epoch=1)
    src._positions(stream, [frames.Position(PQ, at, at)], full=True)
    return stream


def _append(src: FetchSource, q, bodies: list[bytes], ts_ms: int) -> None:
    records = pack_records(bodies)
    first = q.append_records(records, len(bodies), ts_ms)
    src.written(PQ, stored_run(q, first, records, len(bodies), 0))


async def test_the_runs_a_stream_sends_from_memory_are_the_runs_the_file_holds(tmp_path):
    with QueueStore(str(tmp_path / "q")) as store:
        q = store.open_or_create(PQ)
        src = _source(store)
        try:
            _follow(src, "b2", 0)
            # the clock going back: storage raises a run's time to the last one's, and so must the copy
            for i, ts in enumerate((1_000, 900, 1_200, 1_200, 1_100)):
                _append(src, q, [b"m%d-%d" % (i, j) for j in range(i + 1)], ts)
            from_memory = src._recent_runs(PQ, 0, q.next_offset, 1 << 20)
            from_file = q.read_runs(0, 1_000, 1 << 20, written=True)
            assert [r.ts_ms for r in from_memory] == [1_000, 1_000, 1_200, 1_200, 1_200]
            assert [tuple(r) for r in from_memory] == [tuple(r) for r in from_file]
            sections = await src._read([(PQ, 3)], written=True)   # from the second run on: a run's start
            assert [tuple(r) for r in sections[0].runs] == [tuple(r) for r in from_file[2:]]
            assert sections[0].end == q.next_offset == 15
        finally:
            src.stop()


def test_a_copy_that_ends_inside_a_run_or_before_the_kept_ones_is_read_from_the_file(tmp_path):
    with QueueStore(str(tmp_path / "q")) as store:
        q = store.open_or_create(PQ)
        src = _source(store)
        try:
            _follow(src, "b2", 0)
            _append(src, q, [b"a", b"b"], 1)
            _append(src, q, [b"c"], 2)
            assert src._recent_runs(PQ, 1, 3, 1 << 20) is None   # inside the first run
            assert src._recent_runs(PQ, 3, 3, 1 << 20) is None   # past the end
            assert [r.offset for r in src._recent_runs(PQ, 2, 3, 1 << 20)] == [2]
            # runs past the queue's end now (a queue reopened shorter) are never sent, kept or not
            assert [r.offset for r in src._recent_runs(PQ, 0, 2, 1 << 20)] == [0]
            assert src._recent_runs(PQ, 2, 2, 1 << 20) is None
            # the streams sent the first run: it is dropped, and a copy that far back reads the file
            next(iter(src._subscribers[PQ])).sent[PQ][0] = 2
            src._trim_recent(PQ)
            assert src._recent_runs(PQ, 0, 3, 1 << 20) is None
            assert src._recent_bytes == len(pack_records([b"c"]))
        finally:
            src.stop()


def test_the_runs_kept_stay_within_their_bounds_and_follow_on_without_a_gap(tmp_path, monkeypatch):
    monkeypatch.setattr(source, "RECENT_QUEUE_BYTES_MAX", 3 * (100 + 4))
    with QueueStore(str(tmp_path / "q")) as store:
        q = store.open_or_create(PQ)
        src = _source(store)
        try:
            slow = _follow(src, "b2", 0)
            _follow(src, "b3", 0)
            for i in range(5):
                _append(src, q, [bytes([i]) * 100], i)
            kept = src._recent[PQ]
            assert [r.offset for r in kept.runs] == [2, 3, 4] and kept.bytes == src._recent_bytes == 3 * 104
            # trimmed only past what every stream sent: the slowest one holds them
            for st in src._subscribers[PQ]:
                st.sent[PQ][0] = 5 if st is not slow else 3
            src._trim_recent(PQ)
            assert [r.offset for r in kept.runs] == [3, 4]
            # a run that does not follow on (the queue reopened shorter) starts the kept runs over
            src.written(PQ, stored_run(q, 4, pack_records([b"z"]), 1, 0))
            assert [r.offset for r in src._recent[PQ].runs] == [4] and src._recent_bytes == len(pack_records([b"z"]))
            # the last stream gone: nothing is kept
            for st in list(src._subscribers[PQ]):
                src._unsubscribe(PQ, st)
            assert PQ not in src._recent and src._recent_bytes == 0
            _append(src, q, [b"y"], 9)
            assert PQ not in src._recent
        finally:
            src.stop()


def test_the_frames_header_layout_is_what_the_module_says():
    # flags u8 then count u32: a follower built elsewhere must find the same bytes
    assert frames.encode_positions([], False) == struct.pack("<BI", 0, 0)
