"""``stator export``: the log's history to Parquet (issue 8, part 1), against a real three-node meta cluster.

No JVM here: the files are read back with pyarrow, as Spark will read them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.dataset as ds
import pytest

from meta.export import exporter, schema
from tests.support.meta_http import ok


def read_back(out: str) -> dict[str, pa.Table]:
    tables = {}
    for name in (schema.MAPPING, schema.LOCKS):
        path = os.path.join(out, name)
        if os.path.isdir(path):
            tables[name] = ds.dataset(path, format="parquet", partitioning="hive").to_table()
    return tables


def versions(tables: dict[str, pa.Table]) -> list[int]:
    return sorted(v for t in tables.values() for v in t.column("version").to_pylist())


async def make_history(c, topics: int = 3) -> int:
    await ok(c, "PUT", "/v1/brokers/bx", "broker", {"address": "http://127.0.0.1:9"})
    for i in range(topics):
        await ok(c, "POST", "/v1/topics", "admin", {"topic": f"t{i}", "queues": 2}, expect=(201,))
    answer = await ok(c, "POST", "/v1/groups/g/heartbeat", "client", {"member": "m", "topics": ["t0"],
                                                                        "mode": "exclusive"})
    return answer["version"]


def test_rows_keep_microsecond_utc_times_and_split_by_table():
    lock = {"version": 7, "ts": 1_700_000_000_123, "type": "LockGranted", "v": 1, "topic": "t",
            "data": {"group": "g", "topic": "t", "queue": 1, "member": "m", "token": 3}}
    assert schema.table_of(lock) == schema.LOCKS and schema.day_of(lock) == "2023-11-14"
    table = schema.arrow_table(schema.LOCKS, [schema.row(schema.LOCKS, lock)])
    assert table.schema.field("ts").type == pa.timestamp("us", tz="UTC")
    assert table.column("ts").cast(pa.int64()).to_pylist() == [1_700_000_000_123_000]
    assert table.to_pylist()[0]["token"] == 3 and table.to_pylist()[0]["schema_version"] == schema.SCHEMA_VERSION
    seg = {"version": 8, "ts": 1, "type": "SegmentSealed", "v": 1, "topic": "t",
           "data": {"topic": "t", "queue": 0, "gen": 2, "broker": "b1", "physical_end": 5, "logic_end": 9, "by": "x"}}
    assert schema.table_of(seg) == schema.MAPPING
    assert schema.row(schema.MAPPING, seg)["gen"] == 2
    assert [exporter.chunk_first(v) for v in (1, exporter.CHUNK_VERSIONS, exporter.CHUNK_VERSIONS + 1)] == \
        [1, 1, exporter.CHUNK_VERSIONS + 1]


async def test_export_is_complete_incremental_and_idempotent(meta_cluster, tmp_path):
    c = meta_cluster
    head = await make_history(c)
    out = str(tmp_path / "export")
    first = await exporter.export(c.meta_urls, c.token("client"), out)
    tables = read_back(out)
    assert first.last_version >= head and versions(tables) == list(range(1, first.last_version + 1))
    assert set(tables[schema.LOCKS].column("type").to_pylist()) >= {"GroupMemberJoined", "LockGranted"}
    assert "TopicCreated" in tables[schema.MAPPING].column("type").to_pylist()
    again = await exporter.export(c.meta_urls, c.token("client"), out)
    assert (again.events, again.last_version) == (0, first.last_version), "a second run exports nothing twice"
    await ok(c, "POST", "/v1/topics", "admin", {"topic": "later", "queues": 1}, expect=(201,))
    more = await exporter.export(c.meta_urls, c.token("client"), out)
    assert more.last_version > first.last_version
    assert versions(read_back(out)) == list(range(1, more.last_version + 1)), "each version exactly once"


async def test_an_export_interrupted_between_ranges_leaves_no_duplicate_or_missing_row(meta_cluster, tmp_path,
                                                                                         monkeypatch):
    c = meta_cluster
    head = await make_history(c, topics=4)
    for url in c.meta_urls:   # the export may ask any node: each must hold the whole history first (a follower may lag)
        await ok(c, "GET", f"/v1/cluster?min_version={head}", "client", url=url)
    monkeypatch.setattr(exporter, "CHUNK_VERSIONS", 5)   # many small ranges, so the run can stop between two
    out = str(tmp_path / "export")
    real = exporter.Destination.write_state
    calls = []

    def crash_on_second_state(self, last_version):
        calls.append(last_version)
        if len(calls) == 2:
            raise OSError("disk full")   # the data of the second range is written, its state is not
        real(self, last_version)
    monkeypatch.setattr(exporter.Destination, "write_state", crash_on_second_state)
    with pytest.raises(OSError):
        await exporter.export(c.meta_urls, c.token("client"), out)
    monkeypatch.setattr(exporter.Destination, "write_state", real)
    done = await exporter.export(c.meta_urls, c.token("client"), out)
    assert done.exported_after == calls[0]
    assert versions(read_back(out)) == list(range(1, done.last_version + 1))
    leftovers = [f for _, _, files in os.walk(out) for f in files if f.startswith("_tmp-")]
    assert leftovers == []


async def test_an_export_from_a_follower_equals_one_from_the_leader(meta_cluster, tmp_path):
    c = meta_cluster
    head = await make_history(c)
    rows = []
    for i, url in enumerate(c.meta_urls):
        await ok(c, "GET", f"/v1/cluster?min_version={head}", "client", url=url)
        out = str(tmp_path / f"from-{i}")
        await exporter.export([url], c.token("client"), out)
        tables = read_back(out)
        rows.append({name: sorted(t.drop_columns(["day"]).to_pylist(), key=lambda r: r["version"])
                     for name, t in tables.items()})
    assert rows[0] == rows[1] == rows[2]


async def test_the_cli_exports_and_says_what_it_did(meta_cluster, tmp_path):
    c = meta_cluster
    await make_history(c, topics=1)
    out = str(tmp_path / "cli")
    env = {**os.environ, "STATOR_TOKEN": c.token("client")}
    run = subprocess.run([sys.executable, "-m", "ops.cli", "export", "--meta", ",".join(c.meta_urls), "--out", out,
                          "-w", "json"], capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 0, run.stderr
    said = json.loads(run.stdout)
    assert said["exported_after"] == 0 and said["last_version"] == said["events"] > 0
    # For people (the default, as every command): the same as a table of fields; and a cluster without a leader
    # exports what the answering node applied, with --consistency serializable
    # bx never heartbeats: its 3 s session may have run out while the CLI ran on a loaded machine (NO_BROKERS)
    await ok(c, "PUT", "/v1/brokers/bx", "broker", {"address": "http://127.0.0.1:9"})
    await ok(c, "POST", "/v1/topics", "admin", {"topic": "after", "queues": 1}, expect=(201,))
    head = (await ok(c, "GET", "/v1/cluster?consistency=linearizable", "client",
                     url=c.meta_urls[0]))["applied_version"]
    for name in ("m2", "m3"):
        c.kill9(name)
    table = subprocess.run([sys.executable, "-m", "ops.cli", "export", "--endpoints", c.meta_urls[0], "--out", out,
                            "--consistency", "serializable"], capture_output=True, text=True, timeout=120, env=env)
    assert table.returncode == 0, table.stderr
    shown = dict(line.split(":", 1) for line in table.stdout.strip().splitlines())
    assert int({k.strip(): v.strip() for k, v in shown.items()}["last version"]) >= head, table.stdout
    bad = subprocess.run([sys.executable, "-m", "ops.cli", "export", "--meta", c.meta_urls[0], "--out", out],
                         capture_output=True, text=True, timeout=120, env={**os.environ, "STATOR_TOKEN": "wrong"})
    assert bad.returncode == 1 and bad.stderr.startswith("error: ") and "Traceback" not in bad.stderr
