"""The image's compact form (meta/chains.py, packed slot tables, packed history lines) is only a representation:
the same log gives the same state, through snapshots of either form, and a queue stays cheap."""

from __future__ import annotations

import json
import tracemalloc
from typing import Any

import pytest

from meta import allocation, chains, history_lines
from meta.raft import snapshot_file
from meta.image import Image, restoring_pairs
from meta.state_machine import StateMachine
from meta.deciders import topics
from tests.support.state_machine_builders import Log, chains_of, check_image_invariants

# Measured 55: a pointer to a shared segment, a packed slot range, a share of a packed history line (a dict per
# segment and a list per slot range were about 800).
FRESH_QUEUE_BYTES_MAX = 120


def _busy_log() -> Log:
    """Creations, a growth, remaps (sealed and not yet), grants and a deletion: every kind of chain entry."""
    log = Log()
    for b in ("a", "b", "c"):
        log.register(b)
    log.create("t", 6)
    log.create("big", 300)        # its creation event is past history_lines.PACK_MIN_CHARS
    log.create("gone", 2)
    log.ok({"type": "DeleteTopic", "topic": "gone"})
    log.remap("t", ["a"])
    log.seal_all_sealing()
    log.grow("t", 8)
    log.seal_all_sealing()
    log.remap("t", ["b", "c"])    # left sealing: heads without a logic start
    head = chains.head_of(log.topic("big"), 0)
    log.ok({"type": "GrantOffsetBudget", "broker": head["broker"], "epoch": log.epoch(head["broker"]),
            "grants": [{"topic": "big", "queue": 0, "gen": 0, "budget_end": head["budget_end"] * 2}]})
    return log


def _old_form(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` as an image written before the compact form: a dict per segment, a list per slot range, every
    history line plain."""
    old = json.loads(json.dumps(data))
    for name, t in old["topics"].items():
        del t["chains"]   # the old form's key was last too
        t["logic_queues"] = [chain for _q, chain in chains.chains(data["topics"][name])]
        t["slot_table"] = allocation.slot_table(t["slot_table"])
    old["history"] = [history_lines.unpack(line) for line in old["history"]]
    return old


def test_an_image_of_the_old_form_restores_to_the_same_state():
    log = _busy_log()
    check_image_invariants(log.sm.image)
    old = _old_form(log.sm.image.data)
    assert any(len(q) > 1 for t in old["topics"].values() for q in t["logic_queues"])
    restored = Image(old)
    assert restored.canonical_bytes() == log.sm.image.canonical_bytes()
    check_image_invariants(restored)


def test_a_snapshot_round_trip_keeps_the_state_and_the_sharing():
    log = _busy_log()
    restored = Image(json.loads(json.dumps(log.sm.image.data)))
    assert restored.canonical_bytes() == log.sm.image.canonical_bytes()
    heads = {id(e) for e in restored.topics["big"]["chains"][1:]}
    assert len(heads) <= 3, "equal segments are shared again after a restore (one per broker)"
    # The restored image goes on exactly as the original: the same next command, the same next state.
    again = Log(sm=StateMachine(restored))
    again.ts = log.ts
    for lg in (log, again):
        lg.remap("big", ["a"])
        lg.seal_all_sealing()
    assert again.sm.image.canonical_bytes() == log.sm.image.canonical_bytes()


def test_reads_show_segments_as_the_api_does_and_never_change_the_image():
    log = _busy_log()
    t = log.topic("t")
    seg = log.sm.image.segment("t", 0, 0)
    assert seg["physical_queue"] == allocation.physical_queue_name("t", t["incarnation"], 0, 0)
    assert set(seg) == set(chains.FIELDS)
    before = log.sm.image.canonical_bytes()
    seg["state"] = "sealed"
    chains.head_of(t, 1)["broker"] = "nowhere"
    assert log.sm.image.canonical_bytes() == before


def test_big_history_lines_are_packed_and_read_back_whole():
    log = _busy_log()
    data = log.sm.image.data
    packed = [line for line in data["history"] if line.startswith(history_lines.PACKED_MARK)]
    assert packed, "the 300-queue creation is packed"
    lines = log.sm.image.history_lines()
    assert all(line.startswith("{") for line in lines)
    created = next(json.loads(line) for line in lines if '"TopicCreated"' in line and '"big"' in line)
    assert len(created["data"]["segments"]) == 300
    assert sum(map(len, packed)) * 4 < sum(len(history_lines.unpack(p)) for p in packed)
    assert log.sm.image.history_after(0, 10**6) == lines


def test_a_fresh_queue_costs_a_pointer_not_a_dict():
    log = Log()
    for b in ("a", "b", "c"):
        log.register(b)
    log.create("warm", 1000)  # first-use allocations (interned ints, caches) out of the way
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for i in range(20):
            log.create(f"t{i}", 1000)
        used = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    per_queue = used / 20_000
    assert per_queue < FRESH_QUEUE_BYTES_MAX, f"{per_queue:.0f} B per queue"


def test_a_snapshot_compacts_each_topic_as_it_is_parsed(tmp_path):
    log = _busy_log()
    path = str(tmp_path / "raft.snapshot")
    entry = snapshot_file.LogEntry(2, 1, b"\x00x")
    for form in (log.sm.image.data, _old_form(log.sm.image.data)):
        snapshot_file.write(path, snapshot_file.Snapshot(form, entry, snapshot_file.LogEntry(1, 1, b"\x01"), ()))
        image = snapshot_file.read(path, restoring_pairs).image
        assert all(isinstance(t["slot_table"], tuple) and isinstance(t["chains"][0], tuple)
                   for t in image["topics"].values()), "compact straight from the parser"
        assert Image(image).canonical_bytes() == log.sm.image.canonical_bytes()


def test_a_topic_config_that_looks_like_a_topic_is_left_alone():
    config = {"incarnation": "1", "slot_table": "x", "chains": "y"}
    assert restoring_pairs(list(config.items())) == config


def test_a_malformed_topic_makes_the_snapshot_unreadable_not_a_crash(tmp_path):
    data = Image().data
    data["topics"]["t"] = {"topic": "t", "incarnation": 1, "slot_table": [[0, 1, 0]], "chains": [[]]}
    path = str(tmp_path / "raft.snapshot")
    snapshot_file.write(path, snapshot_file.Snapshot(data, snapshot_file.LogEntry(2, 1, b"\x00x"),
                                                     snapshot_file.LogEntry(1, 1, b"\x01"), ()))
    with pytest.raises(snapshot_file.SnapshotFormatError, match="malformed"):
        snapshot_file.read(path, restoring_pairs)


def test_queues_placed_alike_share_a_segment_but_never_one_that_differs_in_its_copies():
    # A creation makes one segment per way of placing a queue (meta/image.py _place_first_segments): a queue whose
    # in-sync copies differ from its neighbours' (any event the log holds is applied as written) keeps its own.
    log = Log()
    for b in ("a", "b", "c"):
        log.register(b)
    image = Image(json.loads(log.sm.image.canonical_bytes()))
    events, _answer = topics.create(image, {"type": "CreateTopic", "topic": "t", "queues": 9}, 5_000, 1000)
    event = next(e for e in events if e["type"] == "TopicCreated")
    odd = event["segments"][0]
    odd["in_sync"] = odd["in_sync"][:1]
    for e in events:
        image.replay(e, 5_000)
    t = image.data["topics"]["t"]
    alike = [s["queue"] for s in event["segments"] if s["broker"] == odd["broker"] and s is not odd]
    assert len(alike) >= 2, "the test needs three queues on one broker"
    assert [seg["in_sync"] for seg in chains_of(t)[odd["queue"]]] == [odd["in_sync"]]
    assert all(chains_of(t)[q][0]["in_sync"] == event["segments"][q]["in_sync"] for q in alike)
    assert t["chains"][alike[0]] is t["chains"][alike[-1]] and t["chains"][odd["queue"]] is not t["chains"][alike[0]]
    check_image_invariants(image)
