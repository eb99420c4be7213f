"""Random damage to every file format the broker and the meta node keep on disk is detected, never served.

Each test writes real files with the real code (storage classes on a temporary directory: the format code is what is
under test), then hypothesis flips bytes in them or cuts them short, and the property is checked on what the code
reads back:

- segment data and index files (broker/storage): every record a read returns is the record written at that offset;
  damage is a CorruptData answer naming where reading resumes, or (in the last file, recovered like a torn write)
  records missing from its end. Never another record's bytes.
- offsets.log and the pop journal (broker/storage/lines.py): the state loaded is the state of some prefix of the
  lines written (a cut tail: the remains of a write a crash tore, never acknowledged), or loading raises CorruptFile
  whose message names the file. Never a value no line held. A flip inside a whole line is always refused (a tear
  leaves a line without its newline or with zero bytes), asserted too.
- the meta snapshot (meta/raft/snapshot_file.py, gzip'd JSON: gzip's CRC-32 covers the content): reading returns the
  snapshot written, or raises SnapshotFormatError naming the file.
- the meta node's raft journal and its state file (meta/raft/journal.py, a CRC over every record): loading returns
  the entries written, or a prefix of them when the tail was cut (a torn write), or raises JournalDamaged naming
  the file; a flip inside the file is never loaded silently (tests/test_raft_journal.py counts 1,000 of them).

And the processes themselves: a broker on a damaged offsets file or pop journal, and a meta node on a damaged
journal, refuse to start with one error line naming the file.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.offsets import OffsetStore
from broker.pop import journal as journal_mod
from broker.pop.state import QueueState
from broker.storage import CorruptData, PhysicalQueue, QueueConfig, StorageError, files
from broker.storage import lines
from broker.storage.errors import CorruptFile, UnsupportedFormat
from meta.raft import pysyncobj_shim as shim
from meta.raft import snapshot_file
from meta.raft.journal import STATE_FILE, JournalDamaged, StatorJournal, journal_files, read_journal, segment_name
from meta.image import Image
from tests.support import cluster as cluster_mod

EXAMPLES = 120
SEGMENT_EXAMPLES = 80
RECORDS = 60
CONFIG = QueueConfig(segment_bytes_max=1024, index_interval_bytes=64, index_interval_records=3)
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@st.composite
def damage(draw) -> tuple[str, list[tuple[float, int]], float | None]:
    """(what, [(where as a fraction of the file, xor mask)], cut at a fraction or None)."""
    flips = draw(st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(1, 255)), min_size=0, max_size=3))
    cut = draw(st.none() | st.floats(0, 1, exclude_max=True))
    if not flips and cut is None:
        flips = [(draw(st.floats(0, 1, exclude_max=True)), draw(st.integers(1, 255)))]
    return f"flips={flips} cut={cut}", flips, cut


def apply_damage(path: Path, flips: list[tuple[float, int]], cut: float | None) -> bool:
    """Damages the file in place; False when it is empty (nothing to damage)."""
    data = bytearray(path.read_bytes())
    if not data:
        return False
    for where, mask in flips:
        data[int(where * len(data))] ^= mask
    if cut is not None:
        del data[int(cut * len(data)):]
    path.write_bytes(bytes(data))
    return True


# -- segment files -------------------------------------------------------------------------------------------------

def payload(offset: int) -> bytes:
    return f"record {offset} ".encode() * (1 + offset % 4)


def written_queue(root: Path, clean: bool) -> Path:
    path = root / "q"
    q = PhysicalQueue.create(str(path), 0, CONFIG)
    for first in range(0, RECORDS, 3):
        q.append([payload(o) for o in range(first, first + 3)], 1_000 + first)
    q.close()
    if not clean:
        (path / files.CLEAN_MARKER).unlink()
    return path


def served(path: Path) -> dict[int, tuple[int, bytes]]:
    """Everything reads return, from the first offset on, skipping each damaged range where CorruptData says."""
    out: dict[int, tuple[int, bytes]] = {}
    with PhysicalQueue.open(str(path), CONFIG) as q:
        offset, end = q.min_offset, q.max_offset
        while offset < end:
            try:
                records = q.read(offset, 7)
            except CorruptData as e:
                # It names the offset asked for: a read never skips good records in front of the damage.
                assert e.offset == offset, (e.offset, offset)
                assert e.next_offset is not None and e.next_offset > offset, e.details
                offset = e.next_offset
                continue
            assert records, f"an empty read at {offset} below the end {end}"
            for r in records:
                assert r.offset not in out, f"offset {r.offset} served twice"
                out[r.offset] = (r.ts_ms, r.payload)
            offset = records[-1].offset + 1
    return out


@settings(SETTINGS, max_examples=SEGMENT_EXAMPLES)   # each opens and reads a whole queue of small files
@given(which=st.integers(0, 1000), index=st.booleans(), clean=st.booleans(), hurt=damage())
def test_damaged_segment_files_never_serve_a_wrong_record(tmp_path, which, index, clean, hurt):
    what, flips, cut = hurt
    with tempfile.TemporaryDirectory(dir=tmp_path) as root:
        path = written_queue(Path(root), clean)
        targets = sorted(path.glob("*.index" if index else "*.log"))
        target = targets[which % len(targets)]
        if not apply_damage(target, flips, cut):
            return
        try:
            records = served(path)
        except StorageError as e:   # a queue that cannot be opened at all says so with its code
            assert e.code in ("CORRUPT_QUEUE", "CORRUPT_DATA"), (e.code, e.message, what)
            return
        for offset, (ts, body) in records.items():
            assert body == payload(offset) and ts == 1_000 + offset - offset % 3, \
                f"offset {offset} served {body!r} after {what} of {target.name}"


# -- checked JSON lines: offsets.log and the pop journal -------------------------------------------------------------

def prefixes(path: Path, load) -> list:
    """What loading gives for every prefix of the file's whole lines: the states a torn tail may leave."""
    data = path.read_bytes()
    cuts = [0] + [i + 1 for i, b in enumerate(data) if b == ord("\n")]
    out = []
    for n in cuts:
        with tempfile.TemporaryDirectory(dir=path.parent) as d:
            part = Path(d) / path.name
            part.write_bytes(data[:n])
            out.append(load(part))
    return out


def flipped_inside_a_line(original: bytes, flips: list[tuple[float, int]], cut: float | None) -> bool:
    """Whether a flip changed a line that the damaged file still holds whole (ending in its newline, before the cut)
    and without a zero byte: damage no tear can leave, which loading must refuse."""
    data = bytearray(original)
    for where, mask in flips:
        data[int(where * len(data))] ^= mask
    end = len(data) if cut is None else int(cut * len(data))
    for where, _mask in flips:
        at = int(where * len(original))
        if data[at] == original[at] or data[at] == ord("\n"):
            continue                                  # flipped back, or a new line split: checked by the prefix
        line_end = data.find(b"\n", at)
        line_start = data.rfind(b"\n", 0, at) + 1
        if 0 <= line_end < end and b"\0" not in data[line_start:line_end]:
            return True
    return False


def load_offsets(path: Path) -> dict:
    store = OffsetStore(str(path))
    try:
        return {k: store.get(*k) for k in store._offsets}
    finally:
        store.close()


async def _commit_offsets(path: Path) -> None:
    store = OffsetStore(str(path))
    for i in range(12):
        await store.commit("g", "t", i % 3, 100 + i, gen=0)
    store.close()


@pytest.fixture(scope="module")
def offsets_file(tmp_path_factory) -> tuple[bytes, list]:
    path = tmp_path_factory.mktemp("offsets") / "offsets.log"
    asyncio.run(_commit_offsets(path))
    return path.read_bytes(), prefixes(path, load_offsets)


@SETTINGS
@given(hurt=damage())
def test_a_damaged_offsets_file_loads_a_prefix_or_is_refused_naming_it(tmp_path, offsets_file, hurt):
    original, allowed = offsets_file
    what, flips, cut = hurt
    with tempfile.TemporaryDirectory(dir=tmp_path) as d:
        path = Path(d) / "offsets.log"
        path.write_bytes(original)
        apply_damage(path, flips, cut)
        try:
            loaded = load_offsets(path)
        except CorruptFile as e:
            assert str(path) in str(e) and "\n" not in str(e), str(e)
            return
        assert loaded in allowed, f"{what}: loaded {loaded}, which no prefix of the written lines holds"
        assert not flipped_inside_a_line(original, flips, cut), f"{what}: a damaged whole line was taken for a tear"


def pop_summary(path: Path) -> dict:
    states, _ = journal_mod.load(str(path))
    return {k: (s.next_offset, s.gen, s.frozen,
                sorted((o, d.seq, d.attempt, d.deadline_ms, d.dead) for o, d in s.in_flight.items()))
            for k, s in states.items()}


async def _write_pop_journal(path: Path) -> None:
    clock = [0]
    states, whole = journal_mod.load(str(path))
    j = journal_mod.Journal(str(path), states, whole, now_ms=lambda: clock[0])
    for q in range(2):
        key = ("g", "t", q)
        s = states[key] = QueueState(key, 0)
        for o in range(5):
            s.deliver_new(o, 100 * q + o, 0, 60_000)
        j.touch(key)
    clock[0] = 60_000
    await j.round()
    for q in range(2):
        states[("g", "t", q)].ack(q + 1)
        j.touch(("g", "t", q))
        await j.round()
    await j.close()


@pytest.fixture(scope="module")
def pop_journal_file(tmp_path_factory) -> tuple[bytes, list]:
    path = tmp_path_factory.mktemp("pop") / "journal.log"
    asyncio.run(_write_pop_journal(path))
    assert path.read_bytes().count(b"\n") >= 3
    return path.read_bytes(), prefixes(path, pop_summary)


@SETTINGS
@given(hurt=damage())
def test_a_damaged_pop_journal_loads_a_prefix_or_is_refused_naming_it(tmp_path, pop_journal_file, hurt):
    original, allowed = pop_journal_file
    what, flips, cut = hurt
    with tempfile.TemporaryDirectory(dir=tmp_path) as d:
        path = Path(d) / "journal.log"
        path.write_bytes(original)
        apply_damage(path, flips, cut)
        try:
            loaded = pop_summary(path)
        except CorruptFile as e:
            assert str(path) in str(e) and "\n" not in str(e), str(e)
            return
        assert loaded in allowed, f"{what}: loaded {loaded}, which no prefix of the written lines holds"
        assert not flipped_inside_a_line(original, flips, cut), f"{what}: a damaged whole line was taken for a tear"


def test_a_torn_line_s_zeros_excuse_no_other_damaged_line(tmp_path):
    """Found by the pop journal's hypothesis test in CI: a flip that made a zero in one line let a damaged whole
    line after it (a flipped digit, no zero) load as a tear, and the file loaded empty. A tear leaves zeros in every
    line it touched, so each bad line needs its own."""
    good, second, third = lines.encode([1]), lines.encode([2]), lines.encode([3])
    path = tmp_path / "f.log"
    zeroed = second[:5] + b"\0" + second[6:]
    flipped = third.replace(b"[3]", b"[4]")
    path.write_bytes(good + zeroed + flipped)
    with pytest.raises(CorruptFile, match=r"line 3 \(byte %d\)" % (len(good) + len(second))):
        lines.read(str(path))
    path.write_bytes(good + zeroed + third[:-1].replace(b"[3]", b"\0\0\0") + b"\n")   # both torn: a prefix
    assert lines.read(str(path)) == lines.Loaded([[1]], len(good))


def test_a_zeroed_line_that_good_lines_follow_is_damage_named_by_its_line_and_byte(tmp_path):
    """Zeros alone do not make a tear: a tear is the file's end, so a bad line with zeros that a good line follows
    is damage to acknowledged data, and the first bad line is the one named (not the last, not only a zero-free one)."""
    first, second, third, fourth = (lines.encode([i]) for i in range(1, 5))
    path = tmp_path / "f.log"
    zeroed = second[:5] + b"\0" + second[6:]
    path.write_bytes(first + zeroed + third.replace(b"[3]", b"[9]") + fourth)
    with pytest.raises(CorruptFile) as e:
        lines.read(str(path))
    assert e.value.details == {"path": str(path), "line": 2, "position": len(first)}
    assert e.value.message == (f"{path}: line 2 (byte {len(first)}) is damaged (not a line of format 0 or 1) and good "
                               "lines follow it: acknowledged data was lost; restore the file or cut it at that byte")
    path.write_bytes(first + third.replace(b"[3]", b"[9]"))   # a whole bad last line with no zero: damage too
    with pytest.raises(CorruptFile) as e:
        lines.read(str(path))
    assert e.value.details == {"path": str(path), "line": 2, "position": len(first)}
    assert e.value.message == (f"{path}: line 2 (byte {len(first)}) is damaged (CRC mismatch) and is no torn write "
                               "(whole, no zero bytes): acknowledged data was lost; restore the file or cut it at that "
                               "byte")
    assert lines.read(str(tmp_path / "none.log")) == lines.Loaded([], -1), "no file: nothing, and no whole byte"


def test_lines_of_the_old_format_still_load_and_new_lines_follow_them(tmp_path):
    path = tmp_path / "offsets.log"
    path.write_bytes(b'["g", "t", 0, 5, 0, 1]\n["g", "t", 1, 6, 2, 1]\n')   # format 0 (no check), written by an older broker

    async def commit() -> None:
        store = OffsetStore(str(path))
        assert (store.get("g", "t", 0), store.get("g", "t", 1)) == (5, 6)
        await store.commit("g", "t", 0, 7, gen=1)
        store.close()

    asyncio.run(commit())
    assert path.read_bytes().splitlines()[-1].startswith(b"v1 ")
    assert load_offsets(path) == {("g", "t", 0): 7, ("g", "t", 1): 6}


@pytest.mark.parametrize("old", [b'["g", "t", 0, 5]\n', lines.encode(["g", "t", 0, 5, 0])])
def test_an_offsets_file_from_before_replicated_offsets_is_refused_by_name(tmp_path, old):
    # Offsets were kept without the gen of the head they were committed on, then without their leader's stamp (no
    # deployed brokers: no conversion).
    path = tmp_path / "offsets.log"
    path.write_bytes(old)
    with pytest.raises(CorruptFile, match="before replicated offsets"):
        OffsetStore(str(path))


@pytest.mark.parametrize("name", ["journal.log", "replica.log"])
def test_a_pop_journal_or_copy_of_stator_0_1_is_refused_by_name(tmp_path, name):
    # Its lines have no moved_below (no deployed brokers: no conversion)
    from broker.pop import replica
    path = tmp_path / name
    line = ["g", "t", 0, 5, 0, False, [], []]
    path.write_bytes(lines.encode(line if name == "journal.log" else ["L", line]))
    with pytest.raises(UnsupportedFormat, match="pop journal line of Stator 0.1"):
        (journal_mod if name == "journal.log" else replica).load(str(path))


# -- the meta snapshot ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def snapshot_written(tmp_path_factory) -> tuple[bytes, snapshot_file.Snapshot]:
    image = Image().data
    image["topics"]["t"] = {"queues": [{"gen": 0}] * 8, "config": {"k": "v" * 40}}
    image["version"] = 1234
    snap = snapshot_file.Snapshot(image, snapshot_file.LogEntry(9, 3, b"\x00entry"),
                                  snapshot_file.LogEntry(8, 3, b"\x01"), ("127.0.0.1:1", "127.0.0.1:2"))
    path = tmp_path_factory.mktemp("snap") / "snapshot"
    snapshot_file.write(str(path), snap)
    return path.read_bytes(), snapshot_file.read(str(path))


@SETTINGS
@given(hurt=damage())
def test_a_damaged_meta_snapshot_is_refused_naming_it_or_reads_as_written(tmp_path, snapshot_written, hurt):
    original, snap = snapshot_written
    what, flips, cut = hurt
    with tempfile.TemporaryDirectory(dir=tmp_path) as d:
        path = os.path.join(d, "snapshot")
        Path(path).write_bytes(original)
        apply_damage(Path(path), flips, cut)
        try:
            back = snapshot_file.read(path)
        except snapshot_file.SnapshotFormatError as e:
            assert path in str(e), str(e)
            return
        # gzip's header carries a time and an OS byte no check covers: flipping them changes nothing read.
        assert back == snap, f"{what}: a damaged snapshot read as another one"


# -- a broker on damaged files ---------------------------------------------------------------------------------------

DAMAGED_FIRST_LINES = {   # a first line whose CRC does not match, followed by a good line: damage, not a torn tail
    "offsets.log": (b'v1 0badc0de ["g","t",0,9,0,1]\n', ["g", "t", 0, 1, 0, 2]),
    "pop/journal.log": (b'v1 0badc0de ["g","t",0,9,0,false,0,[],[]]\n', ["g", "t", 1, 3, 0, False, 0, [], []]),
}


def broker_start_refusal(tmp_path, data) -> list[str]:
    """`stator broker serve` on ``data``: it must exit non-zero with one line on stderr, returned."""
    config = tmp_path / "broker.json"
    config.write_text(json.dumps({"broker": "b1", "data_dir": str(data), "http": "127.0.0.1:1",
                                  "meta": ["http://127.0.0.1:2"], "token": "t" * 16, "client_token": "c" * 16}))
    run = subprocess.run([sys.executable, "-m", "ops.cli", "broker", "serve", "--config", str(config)],
                         capture_output=True, text=True, timeout=60)
    err = run.stderr.strip().splitlines()
    assert run.returncode != 0 and len(err) == 1, run.stderr
    return err


@pytest.mark.parametrize("damaged", sorted(DAMAGED_FIRST_LINES))
def test_a_broker_refuses_to_start_on_a_damaged_file_with_one_line_naming_it(tmp_path, damaged):
    data = tmp_path / "data"
    (data / "pop").mkdir(parents=True)
    bad, good = DAMAGED_FIRST_LINES[damaged]
    (data / damaged).write_bytes(bad + lines.encode(good))
    err = broker_start_refusal(tmp_path, data)
    assert err[0].startswith("error: ") and str(data / damaged) in err[0] and "line 1 (byte 0)" in err[0], err


def test_a_broker_refuses_to_start_on_queues_of_another_storage_format_with_one_line(tmp_path):
    """Queues of storage format 1 (no format file) are refused by name at start, never recovered as damaged."""
    data = tmp_path / "data"
    old = data / "queues" / "t.q0"
    old.mkdir(parents=True)
    (old / files.log_name(0)).write_bytes(b"\x05\x00\x00\x00" + bytes(20) + b"hello")
    err = broker_start_refusal(tmp_path, data)
    assert err[0].startswith("error: ") and str(data / "queues") in err[0] and "storage format 1" in err[0], err
    assert (old / files.log_name(0)).stat().st_size == 29, "the old file was left as it was"


# -- the meta node's raft journal (meta/raft/journal.py: a CRC over every record) ----------------------------------

def journal_entries() -> list[tuple[bytes, int, int]]:
    """Entries shaped like a meta node's: a new term's no-op, then envelopes (the type byte and JSON)."""
    entries = [(shim.NO_OP_COMMAND, 1, 1)]
    for i in range(2, 25):
        envelope = json.dumps({"rid": None, "ts": 1_000 + i, "actor": "admin:",
                               "cmd": {"type": "create_topic", "topic": f"t{i}", "queues": i}})
        entries.append((shim.with_envelope(envelope.encode()), i, 1 + i // 12))
    return entries


@pytest.fixture(scope="module")
def journal_written(tmp_path_factory) -> tuple[dict[str, bytes], list]:
    directory = tmp_path_factory.mktemp("journal")
    journal = StatorJournal(str(directory))
    for command, index, term in journal_entries():
        journal.add(command, index, term)
    journal.sync()
    journal.setCurrentTerm(journal_entries()[-1][2], None)
    journal._destroy()
    assert read_journal(str(directory)).entries == journal_entries()
    return {Path(p).name: Path(p).read_bytes() for p in journal_files(str(directory))}, journal_entries()


@SETTINGS
@given(hurt=damage(), which=st.sampled_from([segment_name(1), STATE_FILE]))
def test_a_damaged_raft_journal_is_refused_naming_it_or_loads_a_prefix(tmp_path, journal_written, hurt, which):
    """Every flip is refused by name; a cut tail (a torn write, never acknowledged) loses entries from the end only."""
    files_written, entries = journal_written
    what, flips, cut = hurt
    with tempfile.TemporaryDirectory(dir=tmp_path) as d:
        for name, raw in files_written.items():
            Path(d, name).write_bytes(raw)
        apply_damage(Path(d, which), flips, cut)
        try:
            got = read_journal(d).entries
        except JournalDamaged as e:
            assert os.path.join(d, which) in str(e) and "\n" not in str(e), str(e)
            return
        assert got == entries[:len(got)], f"{what} in {which}: not a prefix of what was written"
        if which == segment_name(1) and flips and cut is None:
            assert got == entries, f"{what}: a flip inside the file lost entries without a word"


def test_a_meta_node_refuses_to_start_on_a_damaged_journal_with_one_line_naming_it(tmp_path):
    from ops import devcluster
    c = cluster_mod.up(str(tmp_path), 1, 0)
    try:
        devcluster.stop_member(c.dir, "m1", signal.SIGTERM)
        journal = journal_files(os.path.join(c.dir, "m1", "data"))[-2]   # the last segment (the state file is last)
        data = bytearray(Path(journal).read_bytes())
        # inside a record (the last segment's records are followed by the zeros of the space allocated ahead): its
        # CRC no longer matches
        data[len(bytes(data).rstrip(b"\0")) // 2] ^= 0x01
        Path(journal).write_bytes(bytes(data))
        with pytest.raises(RuntimeError) as failed:
            c.start("m1")
        log_lines = Path(c.dir, "logs", "m1.log").read_text().strip().splitlines()
        assert log_lines[-1].startswith("error: ") and journal in log_lines[-1], (log_lines[-3:], str(failed.value))
        assert "damaged at byte" in log_lines[-1], log_lines[-1]
    finally:
        devcluster.down(c.dir)
