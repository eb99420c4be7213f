"""producers.log (broker/producer_journal.py) on real files: what a restart loads back, what it leaves out, tears and
compaction. tests/test_power_loss.py resends an idempotent producer's batches after a torn power loss of a real
broker."""

from __future__ import annotations

import os

import pytest

from broker import producer_journal
from broker.producer_journal import ProducerJournal
from broker.producers import Batch, ProducerTable
from broker.storage.errors import CorruptFile


def batch(seq: int, first: int, count: int = 10, producer: int = 7, gen: int = 0, pq: str = "t.q0.g0.i1") -> Batch:
    return Batch(producer, seq, first, count, gen, pq, first + 100)   # physical offsets start at 100


def reopened(path: str, ends: dict[str, int]) -> list[tuple[str, int, Batch]]:
    """What a broker restarting with physical queues of these ends (pq -> recovered end) loads."""
    j = ProducerJournal(path)
    try:
        return list(j.load(lambda pq, end: pq in ends and ends[pq] >= end))
    finally:
        j.close()


def test_batches_are_loaded_back_in_order_and_only_while_their_records_are_held(tmp_path):
    path = str(tmp_path / "producers.log")
    j = ProducerJournal(path)
    written = [("t", 0, batch(s, s * 10)) for s in range(5)] + [("u", 3, batch(0, 0, pq="u.q3.g2.i1", gen=2))]
    for topic, queue, b in written:
        j.append(topic, queue, b)
    j.sync()
    assert j.max_offset == j.next_offset > 0
    j.close()
    assert reopened(path, {"t.q0.g0.i1": 150, "u.q3.g2.i1": 110}) == written
    # The line of batch 4 (physical 140..150) outlived its records (two files, no order between their syncs): a
    # resend of it must be stored again, not answered with offsets another batch may now hold
    assert reopened(path, {"t.q0.g0.i1": 149, "u.q3.g2.i1": 110}) == written[:4] + written[5:]
    assert reopened(path, {"t.q0.g0.i1": 150}) == written[:5], "a deleted physical queue's batches are gone"


def test_a_torn_last_line_is_cut_off_and_the_next_line_is_whole(tmp_path):
    path = str(tmp_path / "producers.log")
    j = ProducerJournal(path)
    j.append("t", 0, batch(0, 0))
    j.append("t", 0, batch(1, 10))
    j.close()
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size - 7)
    j = ProducerJournal(path)
    assert [b.seq for _, _, b in j.load(lambda pq, end: True)] == [0]
    j.append("t", 0, batch(2, 10))
    j.close()
    assert [b.seq for _, _, b in reopened(path, {"t.q0.g0.i1": 1000})] == [0, 2]


def test_a_damaged_line_before_good_ones_refuses_to_start(tmp_path):
    path = str(tmp_path / "producers.log")
    j = ProducerJournal(path)
    for s in range(3):
        j.append("t", 0, batch(s, s * 10))
    j.close()
    data = bytearray(open(path, "rb").read())
    data[data.index(b",7,") + 1] = ord("8")   # the first line's producer id, its CRC unchanged
    open(path, "wb").write(bytes(data))
    with pytest.raises(CorruptFile):
        ProducerJournal(path)


def test_compaction_keeps_exactly_the_tables_batches(tmp_path, monkeypatch):
    monkeypatch.setattr(producer_journal, "COMPACT_AFTER_LINES", 50)
    path = str(tmp_path / "producers.log")
    j = ProducerJournal(path)
    table = ProducerTable()
    compactions = 0
    for s in range(200):   # one producer: the table keeps its last BATCHES_PER_PRODUCER
        b = batch(s, s * 10)
        assert table.record("t", 0, b)
        j.append("t", 0, b)
        appended = os.path.getsize(path)
        j.maybe_compact(table.entries)
        if os.path.getsize(path) < appended:
            compactions += 1
            assert j.max_offset == j.next_offset, "the rewritten file is synced"
    assert compactions >= 3, compactions
    j.append("t", 0, batch(200, 2000))   # appended to the new file
    j.close()
    loaded = reopened(path, {"t.q0.g0.i1": 10_000})
    assert [b.seq for _, _, b in loaded][-9:] == list(range(192, 201))
    assert len(loaded) <= 50 + 1, len(loaded)


def test_a_failed_journal_refuses_batches(tmp_path):
    path = str(tmp_path / "producers.log")
    j = ProducerJournal(path)
    j.sync_failed()
    with pytest.raises(producer_journal.QueueFailed):
        j.append("t", 0, batch(0, 0))
    j.close()


def test_a_batch_handed_over_from_an_older_segment_is_loaded_though_no_queue_here_holds_its_records(tmp_path):
    path = str(tmp_path / "producers.log")
    j = ProducerJournal(path)
    handed = ("t", 0, batch(0, 0, pq="", gen=1)._replace(physical=-1))   # replication/producer_handover.py
    j.append(*handed)
    j.close()
    assert reopened(path, {}) == [handed]


def test_a_batch_handed_over_late_keeps_the_table_in_offset_order_and_forgets_the_oldest():
    table = ProducerTable()
    for s in range(2, 10):   # this head's batches: BATCHES_PER_PRODUCER of them
        assert table.record("t", 0, batch(s, s * 10))
    assert table.record("t", 0, batch(1, 10)) is False, "older than every batch kept: nothing to forget for it"
    assert table.record("t", 0, batch(25, 25, count=1)), "between two kept batches"
    assert [b.first for b in table.batches("t", 0)] == [25, 30, 40, 50, 60, 70, 80, 90], "the oldest (20) forgotten"
    assert table.find("t", 0, 7, 25, 1) is not None and table.find("t", 0, 7, 2, 10) is None
