"""`stator lineage` parsing and printing, without a JVM: the Spark side (ops.lineage.run.answer) is replaced by a
recorder here; tests/test_lineage_spark.py runs the same commands on Spark."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from ops import cli
from ops.lineage import openlineage, output, run, session
from wire.times import iso, parse_iso

LOCATED = {"topic": "t", "queue": 1, "offset": 5, "broker": "b2", "physical_queue": "t.q1.g1.i3",
           "physical_offset": 2, "gen": 1, "from": "2026-01-01T00:00:01.000Z", "to": None}


@pytest.fixture
def asked(monkeypatch):
    """The requests the CLI made, answered from ``answers`` by command."""
    seen: list[run.Request] = []
    answers = {"locate": LOCATED, "verify": [], "moves": {"moves": []}, "route-at": {"topic": "t", "at": "x",
                                                                                      "queues": []}}

    def record(request: run.Request):
        seen.append(request)
        return answers[request.command]
    monkeypatch.setattr(run, "answer", record)
    return seen, answers


def invoke(*args: str):
    return CliRunner().invoke(cli.main, ["lineage", *args])


def test_shared_options_before_or_after_the_subcommand_mean_the_same(asked):
    seen, _ = asked
    before = invoke("--data", "D", "--master", "local[1]", "--json", "locate", "--topic", "t", "--queue", "1",
                    "--offset", "5")
    after = invoke("locate", "--topic", "t", "--queue", "1", "--offset", "5", "--data", "D", "--master", "local[1]",
                   "--json")
    assert before.exit_code == after.exit_code == 0, (before.output, after.output)
    assert json.loads(before.stdout) == json.loads(after.stdout) == LOCATED
    assert seen[0] == seen[1] == run.Request("locate", "D", "local[1]", None, {"topic": "t", "queue": 1, "offset": 5})


def test_write_out_json_is_the_same_as_json_before_or_after_the_subcommand(asked):
    # -w json, as every admin command says it (issue 35); -w table wins over an earlier --json, as the last word
    for args in (("-w", "json", "locate"), ("locate", "-w", "json"), ("--write-out", "json", "locate")):
        shown = invoke("--data", "D", *args, "--topic", "t", "--queue", "1", "--offset", "5")
        assert shown.exit_code == 0 and json.loads(shown.stdout) == LOCATED, (args, shown.output)
    table = invoke("--data", "D", "--json", "locate", "-w", "table", "--topic", "t", "--queue", "1", "--offset", "5")
    assert table.exit_code == 0 and table.stdout == output.for_people("locate", LOCATED) + "\n", table.output
    bad = invoke("--data", "D", "-w", "yaml", "locate", "--topic", "t", "--queue", "1", "--offset", "5")
    assert bad.exit_code == 2 and "yaml" in bad.output


def test_times_are_iso_8601_and_utc_unless_they_say_otherwise(asked):
    seen, _ = asked
    for text in ("2026-01-01T00:00:00Z", "2026-01-01T01:00:00+01:00", "2026-01-01T00:00:00"):
        assert invoke("route-at", "--data", "D", "--topic", "t", "--at", text).exit_code == 0
    assert {r.args["at"] for r in seen} == {parse_iso("2026-01-01T00:00:00Z")} == {1_767_225_600_000_000}
    assert invoke("moves", "--data", "D", "--since", "2026-01-01T00:00:00.5Z", "--broker", "b1").exit_code == 0
    assert seen[-1].args == {"topic": None, "broker": "b1", "since": 1_767_225_600_500_000}
    assert iso(1_767_225_600_500_000) == "2026-01-01T00:00:00.500Z"
    assert iso(1_767_225_600_000_001) == "2026-01-01T00:00:00.000001Z"
    assert iso(parse_iso("2025-12-31T23:59:59.123Z")) == "2025-12-31T23:59:59.123Z"


@pytest.mark.parametrize("args", [
    ("locate", "--topic", "t", "--queue", "0", "--offset", "1"),                       # no --data
    ("locate", "--data", "D", "--topic", "t", "--queue", "0", "--offset", "-1"),
    ("locate", "--data", "D", "--queue", "0", "--offset", "1"),
    ("route-at", "--data", "D", "--topic", "t", "--at", "yesterday"),
    ("locks", "--data", "D"),
    ("moves", "--data", "D", "--master", "local[1]", "--remote", "sc://h:15002"),
])
def test_bad_usage_is_refused_before_any_spark(asked, args):
    seen, _ = asked
    result = invoke(*args)
    assert result.exit_code == 2 and "Error" in result.output, result.output
    assert seen == []


def test_no_export_is_one_error_line_without_starting_spark(monkeypatch, tmp_path):
    def no_jvm(*a, **k):
        raise AssertionError("a session was built for a missing export")
    monkeypatch.setattr(session, "build", no_jvm)
    result = invoke("locate", "--data", str(tmp_path / "none"), "--topic", "t", "--queue", "0", "--offset", "0")
    assert result.exit_code == 1 and result.stdout == ""
    assert result.stderr.startswith("error: EXPORT_NOT_FOUND: no export at ") and result.stderr.count("\n") == 1


def test_verify_exits_non_zero_on_findings_only(asked):
    _, answers = asked
    clean = invoke("verify", "--data", "D")
    assert (clean.exit_code, clean.stdout) == (0, "no findings\n")
    answers["verify"] = [{"kind": "version_gap", "first": 3, "last": 4, "message": "versions 3..4 are missing"}]
    found = invoke("verify", "--data", "D", "--json")
    assert found.exit_code == cli.EXIT_FINDINGS and json.loads(found.stdout) == answers["verify"]


def test_tables_for_people_align_and_show_nothing_as_a_dash():
    text = output.for_people("locate", LOCATED)
    header, row = text.splitlines()
    assert header.split() == [c.upper() for c in output.COLUMNS["locate"]]
    assert row.split()[-1] == "-" and header.index("BROKER") == row.index("b2")
    moves = {"moves": [{"topic": "t", "queue": 0, "from": "b1", "to": "b22", "gen": 1, "version": 9, "ts": "T"}]}
    assert output.for_people("moves", moves).splitlines()[1].split() == ["t", "0", "b1", "b22", "1", "9", "T"]


def test_openlineage_names_datasets_as_its_naming_spec_says(tmp_path):
    def named(uri):
        d = openlineage.dataset(uri)
        return d["namespace"], d["name"]
    assert named("s3a://lake/stator/segments") == ("s3://lake", "stator/segments")
    assert named("hdfs://nn:8020/stator/segments") == ("hdfs://nn:8020", "/stator/segments")
    assert named(str(tmp_path / "segments")) == ("file", str(tmp_path / "segments"))
    assert named(f"file://{tmp_path}/segments") == ("file", f"{tmp_path}/segments")
    event = openlineage.run_event("START", "r", "j", [openlineage.dataset("x", [("version", "bigint")])], [])
    assert event["inputs"][0]["facets"]["schema"]["fields"] == [{"name": "version", "type": "bigint"}]
    assert event["eventTime"].endswith("+00:00") and event["schemaURL"].startswith("https://openlineage.io/spec/")
