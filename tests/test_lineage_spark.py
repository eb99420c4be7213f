"""Lineage on Spark (issue 8, parts 2 and 3) over a real cluster's export and over hand-built histories.

All tests share ONE local[2] session (tests/conftest.py ``spark``). The real history is made once for the module
(tests/support/lineage_story.py) and every answer is checked against what the cluster's own HTTP API said at the time: the
segment chains of GET /v1/topics/T, the routes read after each step, the remap answers, the history's lock events.
Hand-built histories (ops/bench/lineage_events.py, written by the exporter's own writer) plant the faults a real
cluster never makes.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from pyspark.sql import functions as F

from meta.export import exporter
from ops.bench.lineage_events import History
from ops.cli import EXIT_FINDINGS, main
from ops.lineage import job, lock_intervals, queries, segments, tables, verify
from ops.lineage.errors import LineageError
from wire.times import iso
from tests.support import lineage_story
from tests.support.lineage_story import AGAIN, GROUP, TOPIC


@pytest.fixture(scope="module")
def story(tmp_path_factory):
    return lineage_story.make(str(tmp_path_factory.mktemp("lineage")))


@pytest.fixture(scope="module")
def export(spark, story):
    return tables.read(spark, story.out)


def ms_iso(ms: int | None) -> str | None:
    return iso(ms * 1000) if ms is not None else None


def event_ts(story, kind: str, **match) -> int:
    found = [e["ts"] for e in story.events
             if e["type"] == kind and all(e["data"].get(k) == v for k, v in match.items())]
    assert len(found) == 1, (kind, match, found)
    return found[0]


@pytest.mark.long(seconds=70)   # its module alone, measured on 2 cores (tests/conftest.py)
def test_locate_every_segment_boundary_across_two_remaps(spark, story, export):
    probes, expected = [], {}
    for q, chain in story.chains.items():
        assert len(chain) == 3, f"queue {q} was not remapped twice: {chain}"
        for seg in chain:
            last = seg["logic_end"] - 1 if seg["logic_end"] is not None else story.written[q] - 1
            assert last >= seg["logic_start"], "every segment of the story holds messages"
            for offset in (seg["logic_start"], last):
                probes.append((TOPIC, q, offset))
                expected[(q, offset)] = (seg["broker"], seg["physical_queue"],
                                         offset - seg["logic_start"] + seg["physical_start"], seg["gen"])
    found = queries.locate_many(segments.derive(export.mapping), spark.createDataFrame(
        probes, "topic string, queue int, offset bigint")).collect()
    assert {(r["queue"], r["offset"]): (r["broker"], r["physical_queue"], r["physical_offset"], r["gen"])
            for r in found} == expected
    assert len(found) == len(probes), "each offset lies in exactly one segment"

    # One answer in full, with when its segment was written: from its logic start to the start of its seal.
    mid = story.chains[0][1]
    answer = queries.locate(spark, export, TOPIC, 0, mid["logic_start"])
    assert answer == {"topic": TOPIC, "queue": 0, "offset": mid["logic_start"], "broker": mid["broker"],
                      "physical_queue": mid["physical_queue"], "physical_offset": mid["physical_start"], "gen": 1,
                      "from": ms_iso(event_ts(story, "LogicStartDecided", topic=TOPIC, queue=0, gen=1)),
                      "to": ms_iso(event_ts(story, "SegmentSealing", topic=TOPIC, queue=0, gen=1))}
    head = queries.locate(spark, export, TOPIC, 1, story.written[1] - 1)
    assert head["gen"] == 2 and head["to"] is None, "the head is still being written"
    # Past the queue's end when the export ran, though within its head's budget: no message there (issue 35)
    for offset in (story.written[1], 999_999):
        with pytest.raises(LineageError) as e:
            queries.locate(spark, export, TOPIC, 1, offset)
        assert e.value.code == "OFFSET_NOT_FOUND" and f"ended at logic offset {story.written[1]}" in e.value.message
    with pytest.raises(LineageError) as e:
        queries.locate(spark, export, TOPIC, 2, 0)
    assert e.value.code == "OFFSET_NOT_FOUND"
    with pytest.raises(LineageError) as e:
        queries.locate(spark, export, "nope", 0, 0)
    assert e.value.code == "TOPIC_NOT_FOUND"


def test_route_at_between_remaps_and_across_a_topic_created_again(story, export):
    assert len(story.routes) == 5
    for name, at_ms, queues in story.routes:
        answer = queries.route_at(export, name, at_ms * 1000)
        assert answer["topic"] == name and answer["at"] == ms_iso(at_ms)
        assert {q["queue"]: (q["broker"], q["physical_queue"], q["gen"]) for q in answer["queues"]} == queues
    first, second = [q for name, _, q in story.routes if name == AGAIN]
    assert first[0][1] != second[0][1], "each incarnation has its own physical queue"
    (name, deleted_ms), = story.gaps
    with pytest.raises(LineageError) as e:
        queries.route_at(export, name, deleted_ms * 1000)
    assert e.value.code == "TOPIC_NOT_FOUND", "between the deletion and the new creation the topic did not exist"


def test_moves_per_topic_and_per_broker(story, export):
    def key(m):
        return (m["topic"], m["queue"], m["from"], m["to"], m["gen"])
    moves = queries.moves(export)["moves"]
    assert sorted(map(key, moves)) == sorted(map(key, story.moves)) and len(moves) == 4
    by_answer = {key(m): m["version"] for m in story.moves}
    for m in moves:
        assert m["version"] <= by_answer[key(m)], "the move's event is part of its remap's answer"
        assert m["ts"] == ms_iso(event_ts(story, "SegmentOpened", topic=m["topic"], queue=m["queue"], gen=m["gen"]))
    assert [key(m) for m in queries.moves(export, topic=TOPIC)["moves"]] == [key(m) for m in moves]
    assert queries.moves(export, topic=AGAIN)["moves"] == []
    for broker in ("b1", "b2", "b3"):
        got = queries.moves(export, broker=broker)["moves"]
        assert sorted(map(key, got)) == sorted(key(m) for m in story.moves if broker in (m["from"], m["to"]))
    after_first = queries.moves(export, since_us=event_ts(story, "SegmentOpened", topic=TOPIC, queue=0, gen=2) * 1000)
    assert {(m["queue"], m["gen"]) for m in after_first["moves"]} == {(0, 2), (1, 2)}


def test_lock_holders_from_grants_target_changes_releases_and_expiry(story, export):
    model = []   # the history's own story of each grant: LockGranted until the LockReleased of its token
    for e in story.events:
        d = e["data"]
        if e["type"] == "LockGranted" and d["group"] == GROUP:
            model.append({"group": GROUP, "topic": d["topic"], "queue": d["queue"], "member": d["member"],
                          "token": d["token"], "from": ms_iso(e["ts"]), "to": None})
        elif e["type"] == "LockReleased" and d["group"] == GROUP:
            held, = [m for m in model if m["token"] == d["token"]]
            held["to"] = ms_iso(e["ts"])
    answer = queries.locks(export, GROUP)
    assert answer == {"locks": model}
    reasons = {e["data"]["reason"] for e in story.events if e["type"] == "LockReleased"}
    assert reasons == {"released", "left", "lease_expired"}
    assert any(e["type"] == "LockTargetChanged" for e in story.events)
    holders = [lk["member"] for lk in queries.locks(export, GROUP, topic=TOPIC, queue=0)["locks"]]
    assert holders[0] == "m1" and holders[-1] == "m3" and "m2" in holders
    assert all(lk["to"] is not None for lk in answer["locks"]), "every member left or expired in the end"
    with pytest.raises(LineageError) as e:
        queries.locks(export, "nobody")
    assert e.value.code == "GROUP_NOT_FOUND"


def test_verify_finds_nothing_on_the_real_export(spark, story, export):
    assert verify.findings(export, story.out) == []


def planted_faults(out: str) -> tuple[History, int]:
    """A history with one fault of each kind; returns it and the first version of the hole left in it."""
    h = History()
    h.create_topic("t", ["b1", "b2"], 2)
    h.remap("t", 0, "b2", written=10)
    h.remap("t", 0, "b1", written=5, logic_start=12)       # gen 1 holds 10..14: gen 2 may not start at 12
    first = h.grant("g", "t", 1, "m1")
    h.grant("g", "t", 1, "m2")                             # granted while m1 still holds token `first`
    h.release("g", "t", 1, "m1", first, reason="lease_expired")
    hole = h.version + 1
    h.skip(3)
    h.budget("t", 1, 2_000_000)
    h.events.append(dict(h.events[-1]))                    # the same version twice
    exporter.write_stored(out, h.events)
    exporter.Destination(out).write_state(h.version + 2)  # the state says two more versions were exported
    return h, hole


def test_verify_finds_each_planted_fault(spark, tmp_path):
    out = str(tmp_path / "faulty")
    h, hole = planted_faults(out)
    found = verify.findings(tables.read(spark, out), out)
    by_kind = {}
    for f in found:
        by_kind.setdefault(f["kind"], []).append(f)
    assert set(by_kind) == {"version_gap", "duplicate_version", "segment_overlap", "double_lock_holder"}, found
    assert [(g["first"], g["last"]) for g in by_kind["version_gap"]] == \
        [(hole, hole + 2), (h.version + 1, h.version + 2)]
    assert [d["version"] for d in by_kind["duplicate_version"]] == [h.version]
    (overlap,) = by_kind["segment_overlap"]
    assert (overlap["topic"], overlap["queue"], overlap["gen"], overlap["other_gen"], overlap["logic_start"]) == \
        ("t", 0, 2, 1, 12)
    (double,) = by_kind["double_lock_holder"]
    assert (double["member"], double["token"], double["other_member"], double["other_token"]) == ("m2", 2, "m1", 1)


def test_a_topic_created_again_does_not_bleed_into_the_old_one(spark, tmp_path):
    out = str(tmp_path / "again")
    h = History()
    old = h.create_topic("t", ["b1"], 2)
    h.remap("t", 0, "b2", written=7)
    token = h.grant("g", "t", 0, "m1")
    h.release("g", "t", 0, "m1", token, reason="topic_deleted")
    h.delete_topic("t")
    new = h.create_topic("t", ["b3"], 1)                  # logic offsets start at 0 again, on another queue name
    h.remap("t", 0, "b1", written=4)
    exporter.write_stored(out, h.events)
    export = tables.read(spark, out)
    assert verify.findings(export, out) == [], "the new incarnation's gen 0 overlaps nothing of the old one"
    segs = segments.derive(export.mapping).where(F.col("queue") == 0).orderBy("incarnation", "gen").collect()
    assert [(s["incarnation"], s["gen"]) for s in segs] == [(old, 0), (old, 1), (new, 0), (new, 1)]
    deleted = next(e["version"] for e in h.events if e["type"] == "TopicDeleted")
    assert segs[1]["route_to_version"] == deleted, "the old head leaves the route at the deletion"
    located = queries.locate(spark, export, "t", 0, 2)
    assert located["physical_queue"].endswith(f".i{new}") and located["gen"] == 0
    assert lock_intervals.derive(export.locks).count() == 1


def test_the_cli_prints_json_tables_and_one_line_errors(spark, story, tmp_path):
    runner = CliRunner()
    run = runner.invoke(main, ["lineage", "locate", "--data", story.out, "--topic", TOPIC, "--queue", "0",
                               "--offset", "0", "--json"])
    assert run.exit_code == 0, run.output
    assert json.loads(run.stdout)["physical_queue"] == story.chains[0][0]["physical_queue"]
    run = runner.invoke(main, ["lineage", "--data", story.out, "moves", "--topic", TOPIC])
    lines = run.stdout.strip().splitlines()
    assert run.exit_code == 0 and lines[0].split() == ["TOPIC", "QUEUE", "FROM", "TO", "GEN", "VERSION", "TS"]
    assert len(lines) == 1 + len(story.moves)
    run = runner.invoke(main, ["lineage", "locate", "--data", story.out, "--topic", TOPIC, "--queue", "0",
                               "--offset", str(10**9)])
    assert run.exit_code == 1 and run.stderr.startswith("error: OFFSET_NOT_FOUND: ") and run.stdout == ""
    run = runner.invoke(main, ["lineage", "verify", "--data", story.out])
    assert (run.exit_code, run.stdout.strip()) == (0, "no findings")
    faulty = str(tmp_path / "faulty")
    planted_faults(faulty)
    run = runner.invoke(main, ["lineage", "verify", "--data", faulty, "--json"])
    assert run.exit_code == EXIT_FINDINGS
    assert {f["kind"] for f in json.loads(run.stdout)} == {"version_gap", "duplicate_version", "segment_overlap",
                                                           "double_lock_holder"}


def test_the_job_writes_segments_and_lock_intervals_next_to_the_export(spark, story, capsys):
    assert job.main(["--data", story.out]) == 0     # the entry point spark-submit runs (its session: the shared one)
    counts = {"segments": sum(len(c) for c in story.chains.values()) + 2,
              "lock_intervals": sum(e["type"] == "LockGranted" for e in story.events)}
    assert json.loads(capsys.readouterr().out) == {"out": story.out, **counts}
    segs = spark.read.parquet(f"{story.out}/segments")
    assert tuple(segs.columns) == segments.COLUMNS
    assert segs.where(F.col("logic_end").isNull()).count() == 4, "one open head per queue of each topic"
    assert job.main(["--data", story.out, "--format", "openlineage"]) == 0, "a second run replaces, never appends"
    start, complete = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert (start["eventType"], complete["eventType"]) == ("START", "COMPLETE")
    assert start["run"]["runId"] == complete["run"]["runId"]
    assert [(d["namespace"], d["name"]) for d in complete["inputs"]] == \
        [("file", f"{story.out}/mapping_events"), ("file", f"{story.out}/lock_events")]
    outputs = {d["name"].rsplit("/", 1)[1]: d for d in complete["outputs"]}
    assert {name: d["outputFacets"]["outputStatistics"]["rowCount"] for name, d in outputs.items()} == counts
    assert tuple(f["name"] for f in outputs["segments"]["facets"]["schema"]["fields"]) == segments.COLUMNS
    assert verify.findings(tables.read(spark, story.out), story.out) == [], "the export still reads the same"
