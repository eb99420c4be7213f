"""The marks of which segments' commits a broker's disk holds (broker/offset_witness.py): kept across a restart,
a torn tail cut off, damage refused by name, the limit explicit. What they decide is in tests/test_replicated_offsets.py
(holders back on empty disks never settle a commit whose one holder is down)."""

from __future__ import annotations

import pytest

from broker import offset_witness
from broker.offset_witness import WitnessLog
from broker.storage import lines
from broker.storage.errors import CorruptFile


def test_marks_survive_a_restart_and_are_kept_per_queue(tmp_path):
    path = str(tmp_path / offset_witness.FILE)
    w = WitnessLog(path)
    assert w.held("t", 0) == frozenset()
    w.mark([("t", 0, "t.q0.g0.i1"), ("t", 1, "t.q1.g0.i1"), ("t", 0, "t.q0.g0.i1")])
    w.mark([("t", 0, "t.q0.g1.i1")])
    w.close()
    again = WitnessLog(path)
    assert again.held("t", 0) == {"t.q0.g0.i1", "t.q0.g1.i1"} and again.held("t", 1) == {"t.q1.g0.i1"}
    assert len(lines.read(path).values) == 3, "a mark is written once"
    again.close()


def test_a_torn_tail_is_cut_off_and_a_damaged_line_is_refused(tmp_path):
    path = tmp_path / offset_witness.FILE
    w = WitnessLog(str(path))
    w.mark([("t", 0, "t.q0.g0.i1")])
    w.close()
    path.write_bytes(path.read_bytes() + b'v1 0000')   # a write a crash cut short
    w = WitnessLog(str(path))
    w.mark([("t", 0, "t.q0.g1.i1")])
    w.close()
    assert WitnessLog(str(path)).held("t", 0) == {"t.q0.g0.i1", "t.q0.g1.i1"}
    path.write_bytes(lines.encode(["t", "zero", "t.q0.g0.i1"]) + path.read_bytes())
    with pytest.raises(CorruptFile, match="not \\[topic, queue, physical queue\\]"):
        WitnessLog(str(path))


def test_beyond_its_limit_nothing_more_is_marked(tmp_path, monkeypatch):
    monkeypatch.setattr(offset_witness, "MARKS_MAX", 2)
    w = WitnessLog(str(tmp_path / offset_witness.FILE))
    w.mark([("t", 0, "a"), ("t", 0, "b"), ("t", 0, "c")])
    assert len(w.held("t", 0)) == 2
    w.mark([("t", 1, "d")])
    assert w.held("t", 1) == frozenset(), "unmarked: its answers count for less, never for more"
    w.close()
