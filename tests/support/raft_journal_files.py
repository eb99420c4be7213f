"""Journal records and segment files for the raft journal's tests (meta/raft/journal.py)."""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from pathlib import Path

from meta.raft import journal as rj
from meta.raft.journal import StatorJournal

SMALL_SEGMENT = 200     # four or five of entry()'s records per segment


def entry(i: int, term: int = 1, size: int | None = None) -> tuple[bytes, int, int]:
    """A recognisable command for index ``i`` (never long runs of zeros: a zeroed sector must mean a torn write)."""
    unit = b"%08d;" % i
    size = 1 + i % 97 if size is None else size
    return (unit * (size // len(unit) + 1))[:size], i, term


def fill(journal: StatorJournal, entries: Iterable[tuple[bytes, int, int]]) -> None:
    for e in entries:
        journal.add(*e)


def segment(directory: Path | str, seq: int) -> Path:
    return Path(directory) / rj.segment_name(seq)


def segments(directory: Path | str) -> list[Path]:
    """Every segment file in ``directory``, live or not, by seq."""
    return sorted(p for p in Path(directory).iterdir() if rj._segment_seq(p.name) is not None)


def seqs(directory: Path | str) -> list[int]:
    return [int(p.name.rsplit(".", 1)[1]) for p in segments(directory)]


def log_bytes(directory: Path) -> bytes:
    """The last segment's bytes."""
    return segments(directory)[-1].read_bytes()


def journal_with_last(tmp_path: Path, last_size: int, last_at: int | None = None
                      ) -> tuple[bytes, int, list[tuple[bytes, int, int]]]:
    """A synced journal of 1..5 (one segment) whose last record holds ``last_size`` command bytes and starts at byte
    ``last_at`` (record 4 is sized for it): (segment file, last record's offset, entries)."""
    entries = [entry(i) for i in range(1, 6)]
    first_three = sum(rj.RECORD_OVERHEAD_BYTES + len(e[0]) for e in entries[:3])
    if last_at is not None:
        entries[3] = entry(4, size=last_at - rj.FILE_HEADER_BYTES - first_three - rj.RECORD_OVERHEAD_BYTES)
    entries[4] = entry(5, size=last_size)
    j = StatorJournal(str(tmp_path))
    fill(j, entries)
    j._destroy()
    raw = log_bytes(tmp_path)
    return raw, len(raw) - rj.RECORD_OVERHEAD_BYTES - last_size, entries


def state_line(version: int, body: bytes) -> bytes:
    """A raft.state line of ``version`` holding ``body``, its CRC right."""
    covered = b"STATOR-RAFT-STATE %d " % version
    return covered + b"%08x " % zlib.crc32(body, zlib.crc32(covered)) + body + b"\n"
