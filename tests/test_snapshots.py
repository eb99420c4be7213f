"""Raft snapshots hold the image as plain data, restore in another process, and reach a follower that fell behind.

A real MetaSyncObj in this process (one node, so it leads at once) writes a snapshot that must parse as gzip'd JSON
holding nothing but the image and pysyncobj's two log entries; a new process restores it to the same image bytes.
Then a real three-node cluster compacts its log while a follower is down, and that follower must end on the same
image as the leader: it can only get there by installing the leader's snapshot.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import hashlib
import json
import os
import pathlib
import subprocess
import sys
import time
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from meta.raft import pysyncobj_shim as shim
from meta.raft import snapshot_file
from meta.image import Image
from meta.raft.node import EXIT_REPLICA_UNTRUSTED, SNAPSHOT_FILE, LoopBridge, MetaSyncObj, RaftNode, RaftTuning
from ops import devcluster
from tests.support import cluster as cluster_mod
from tests.support.meta_http import (cluster_status, name_of, node_urls, snapshot_or_none, wait_until,
                                write_through)

REPO = pathlib.Path(__file__).resolve().parent.parent
SECRET = "snapshot-test-secret"
# Compact at most once a second: a single node's compaction window is the first 30 % of every period.
FAST_COMPACTION = RaftTuning(compaction_min_entries=10_000, compaction_min_time_s=1)
WAIT_S = 15.0
QUEUES_BIG = 20_000


def _sha(image: Image) -> str:
    return hashlib.sha256(image.canonical_bytes()).hexdigest()


def _start_single_node(data_dir: str) -> MetaSyncObj:
    node = MetaSyncObj(f"127.0.0.1:{devcluster.free_base_port()}", [], data_dir, SECRET, FAST_COMPACTION,
                       lambda version, changed: None, LoopBridge())
    node.start()
    return node


async def _until(pred, what: str, timeout_s: float = WAIT_S) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = pred()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        await asyncio.sleep(0.05)


async def _write_some(node: MetaSyncObj) -> None:
    loop = asyncio.get_running_loop()
    node.bridge.loop = loop
    raft = RaftNode(node, loop, offset_budget=1000)
    await _until(node.is_leader, "the single node to lead")
    for i in range(3):
        r = await raft.propose({"type": "RegisterBroker", "broker": f"b{i}", "address": "http://127.0.0.1:1"},
                               f"rid-{i}", "broker")
        assert r["ok"], r
    r = await raft.propose({"type": "CreateTopic", "topic": "snap", "queues": 4, "brokers": ["b0", "b1"],
                            "config": {"retention": "7d", "note": "é✓"}}, "rid-topic", "admin")
    assert r["ok"], r


def _compacted(node: MetaSyncObj, path: str) -> snapshot_file.Snapshot | None:
    """The snapshot once it covers every applied entry and the log was cut down to the two entries it keeps."""
    try:
        snap = snapshot_file.read(path)
    except FileNotFoundError:
        return None
    if snap.last_applied.index != node.applied_index or node.getStatus()["log_len"] != 2:
        return None
    return snap


async def _compact(node: MetaSyncObj, data_dir: str) -> snapshot_file.Snapshot:
    node.forceLogCompaction()
    return await _until(lambda: _compacted(node, os.path.join(data_dir, SNAPSHOT_FILE)), "a compacted log")


# ---------------------------------------------------------------------------------------------------------------
def test_the_shim_refuses_any_other_pysyncobj():
    shim.require_version(shim.PYSYNCOBJ_VERSION)
    with pytest.raises(ImportError, match=r"written against pysyncobj 0\.3\.17 .* pysyncobj 0\.3\.18 is installed"):
        shim.require_version("0.3.18")


def test_only_the_shim_names_pysyncobj_private_attributes():
    private = "_SyncObj" + "__"
    offenders = [str(p.relative_to(REPO)) for top in ("meta", "ops", "tests", "broker", "client")
                 for p in (REPO / top).rglob("*.py")
                 if private in p.read_text() and p != REPO / "meta" / "raft" / "pysyncobj_shim.py"]
    assert offenders == [], f"reach pysyncobj's internals through meta/raft/pysyncobj_shim.py: {offenders}"


async def test_a_snapshot_is_gzipped_json_of_the_image_and_nothing_local(tmp_path):
    data_dir = str(tmp_path / "data")
    node = _start_single_node(data_dir)
    try:
        await _write_some(node)
        # Every attribute set after SyncObj.__init__ would be replicated state: only the image may be.
        assert shim.replicated_attribute_names(node) == {"image_data"}
        snap = await _compact(node, data_dir)
        live = node.current_image()
        last_applied = node.applied_index
    finally:
        node.stop()

    # Read with nothing but gzip and json: plain data, not a pickle and not our parser's interpretation of one.
    with gzip.open(os.path.join(data_dir, SNAPSHOT_FILE), "rb") as f:
        doc = json.loads(f.read())
    assert set(doc) == {"format", "version", "image", "raft"}
    assert (doc["format"], doc["version"]) == ("stator-raft-snapshot", 3)
    assert set(doc["raft"]) == {"last_applied", "previous", "cluster"}
    assert doc["raft"]["last_applied"]["index"] == last_applied
    assert doc["raft"]["previous"]["index"] == last_applied - 1
    assert Image(doc["image"]).canonical_bytes() == live.canonical_bytes()
    assert live.topic("snap")["config"]["note"] == "é✓"
    assert Image(snap.image).canonical_bytes() == live.canonical_bytes()
    assert not os.path.exists(os.path.join(data_dir, SNAPSHOT_FILE + ".tmp"))
    assert not os.path.exists(os.path.join(data_dir, SNAPSHOT_FILE + snapshot_file.WRITING_SUFFIX))


RESTORE = """
import asyncio, hashlib, json, sys, time
from meta.offline_log import image_from_data_dir
from meta.raft.node import LoopBridge, MetaSyncObj, RaftTuning
data_dir, raft, secret, commands = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
offline = image_from_data_dir(data_dir)
async def restored():
    node = MetaSyncObj(raft, [], data_dir, secret, RaftTuning(), lambda v, c: None, LoopBridge())
    node.start()
    deadline = time.monotonic() + 10
    while node.current_image().data["commands"] < commands and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    image = node.current_image()
    node.stop()
    return image
image = asyncio.run(restored())
print(json.dumps({"node": hashlib.sha256(image.canonical_bytes()).hexdigest(),
                  "offline": hashlib.sha256(offline.canonical_bytes()).hexdigest()}))
"""


async def _stopped_after_compaction(data_dir: str) -> Image:
    """A single node's data dir with some writes and a snapshot of them; the image it had when it stopped."""
    node = _start_single_node(data_dir)
    try:
        await _write_some(node)
        await _compact(node, data_dir)
        return node.current_image()
    finally:
        node.stop()


async def test_a_node_restarted_on_its_snapshot_does_not_announce_that_everything_changed(tmp_path):
    # "Everything changed" (changed=None) is for a snapshot installed from the leader while the node runs; at
    # start-up nobody holds anything older, and the route warmer took it as a reason to render every route again.
    data_dir = str(tmp_path / "data")
    version = (await _stopped_after_compaction(data_dir)).version
    announced: list[tuple[int, set[str] | None]] = []
    node = MetaSyncObj(f"127.0.0.1:{devcluster.free_base_port()}", [], data_dir, SECRET, FAST_COMPACTION,
                       lambda v, changed: announced.append((v, changed)), LoopBridge())
    try:
        assert node.image_data["version"] == version   # restored from the snapshot
        node.start()
        await _until(lambda: node.applied_index >= node.raftCommitIndex > 0, "the restarted node to apply its log")
        assert node.current_image().version >= version
        assert node.current_image().topic("snap") is not None
        assert all(changed is not None for _, changed in announced), announced
    finally:
        node.stop()


async def test_a_snapshot_restores_in_a_new_process_to_the_same_image_bytes(tmp_path):
    data_dir = str(tmp_path / "data")
    live = await _stopped_after_compaction(data_dir)
    # After the compaction the journal keeps only the snapshot's own two entries: the image can come from the
    # snapshot alone, both in a restarted node and in the offline reader that rebuild-projection uses.
    out = subprocess.run([sys.executable, "-c", RESTORE, data_dir, f"127.0.0.1:{devcluster.free_base_port()}", SECRET,
                          str(live.data["commands"])], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.returncode == 0, out.stderr
    restored = json.loads(out.stdout.strip().splitlines()[-1])
    assert restored == {"node": _sha(live), "offline": _sha(live)}


def test_a_damaged_snapshot_is_refused_not_half_loaded(tmp_path):
    path = str(tmp_path / SNAPSHOT_FILE)
    with gzip.open(path, "wb") as f:
        f.write(b"\x80\x04\x95 a pickle")  # how the snapshots of older versions begin
    with pytest.raises(snapshot_file.SnapshotFormatError, match="a pickled snapshot.*never unpickled"):
        snapshot_file.read(path)
    with gzip.open(path, "wb") as f:
        f.write(b"{not json")
    with pytest.raises(snapshot_file.SnapshotFormatError, match="not JSON"):
        snapshot_file.read(path)
    good = snapshot_file.Snapshot(Image().data, snapshot_file.LogEntry(7, 2, b"\x00abc"),
                                  snapshot_file.LogEntry(6, 2, b"\x01"), ("127.0.0.1:1",))
    doc = json.loads(snapshot_file.encode(good))
    assert snapshot_file.decode(snapshot_file.encode(good)) == good
    for broken, message in (({**doc, "extra": 1}, "exactly"),
                            ({**doc, "version": 2}, f"version {snapshot_file.FORMAT_VERSION} file.*version .2."),
                            ({**doc, "image": []}, "image must be an object"),
                            ({**doc, "raft": {**doc["raft"], "previous": {"index": 5, "term": 2, "command": ""}}},
                             "directly precede"),
                            ({**doc, "raft": {**doc["raft"], "last_applied": {"index": 7, "term": 2,
                                                                              "command": "%%"}}}, "not base64")):
        with pytest.raises(snapshot_file.SnapshotFormatError, match=message):
            snapshot_file.decode(json.dumps(broken).encode())
    with open(path, "wb") as f:
        f.write(gzip.compress(snapshot_file.encode(good))[:-10])  # a write cut short
    with pytest.raises(snapshot_file.SnapshotFormatError, match="not a complete gzip file"):
        snapshot_file.read(path)


UNREADABLE = """
import asyncio, sys
from meta.raft.node import LoopBridge, MetaSyncObj, RaftTuning
async def main():
    node = MetaSyncObj(sys.argv[2], [], sys.argv[1], "secret", RaftTuning(), lambda v, c: None, LoopBridge())
    node.start(asyncio.get_running_loop())
    await asyncio.sleep(10)
asyncio.run(main())
"""


def test_a_node_whose_snapshot_cannot_be_read_stops_instead_of_starting_empty(tmp_path):
    # pysyncobj alone would log the failure and go on with an empty image while its log resumes after the
    # snapshot: a replica that silently diverged.
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / SNAPSHOT_FILE).write_bytes(gzip.compress(b'{"format": "something else"}'))
    out = subprocess.run([sys.executable, "-c", UNREADABLE, str(data_dir), f"127.0.0.1:{devcluster.free_base_port()}"],
                         capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.returncode == EXIT_REPLICA_UNTRUSTED, (out.returncode, out.stderr[-2000:])
    assert "raft_snapshot_unreadable" in out.stdout + out.stderr


def test_the_writer_encodes_in_a_low_priority_child_while_the_caller_goes_on(tmp_path):
    data = Image().data
    # Big enough that encoding it takes a while: the caller must get control back long before the file exists.
    data["topics"]["big"] = {"topic": "big", "logic_queues": [[{"gen": 0, "broker": f"b{q % 7}", "pq": f"big-{q}",
                                                                 "physical_start": 0, "logic_start": q}]
                                                               for q in range(QUEUES_BIG)]}
    snap = snapshot_file.Snapshot(data, snapshot_file.LogEntry(2, 1, b"\x00x"), snapshot_file.LogEntry(1, 1, b"\x01"),
                                  ("127.0.0.1:1",))
    path = str(tmp_path / SNAPSHOT_FILE)
    writer = snapshot_file.BackgroundWriter(path)
    assert writer.poll() is snapshot_file.WriterState.IDLE
    assert writer.start(snap)
    assert writer.pid is not None and writer.pid != os.getpid()
    assert not writer.start(snap), "a second write must wait for the first"
    niceness = []
    deadline = time.monotonic() + WAIT_S
    while (state := writer.poll()) is snapshot_file.WriterState.WRITING:
        with contextlib.suppress(ProcessLookupError):
            niceness.append(os.getpriority(os.PRIO_PROCESS, writer.pid))
        assert time.monotonic() < deadline, "the snapshot writer did not finish"
        time.sleep(0.01)
    assert state is snapshot_file.WriterState.DONE
    assert writer.poll() is snapshot_file.WriterState.IDLE
    assert niceness and niceness[-1] == snapshot_file.SNAPSHOT_WRITER_NICE, niceness
    assert snapshot_file.read(path) == snap


# ---------------------------------------------------------------------------------------------------------------
CLUSTER_COMPACTION = {"raft_tuning": {"compaction_min_entries": 20, "compaction_min_time_s": 1},
                      "session_timeout_ms": 600_000}


async def _digest(c, url: str, version: int) -> dict | None:
    """The node's image digest once it applied ``version``; None while it cannot answer yet (restarting, electing)."""
    s, b, _ = await c.call("GET", f"{url}/v1/admin/image-digest?min_version={version}")
    return b if s == 200 else None


@pytest.mark.slow
async def test_a_follower_behind_the_compacted_log_installs_the_leaders_snapshot(tmp_path):
    async with cluster_mod.running(str(tmp_path), 3, 0, meta=CLUSTER_COMPACTION) as c:
        _leader, _lurl, followers = await node_urls(c)
        await write_through(c, c.meta_urls, "PUT", "/v1/brokers/b0", {"address": "http://127.0.0.1:1"}, role="broker")
        behind = name_of(c, followers[0])
        furl = c.url(behind)
        live = [u for u in c.meta_urls if u != furl]
        await asyncio.to_thread(devcluster.stop_member, c.dir, behind)
        # Nothing is being written now, so no log holds more than the live nodes have committed.
        stopped_at = max([(await cluster_status(c, u))["commit_index"] for u in live])
        await write_through(c, live, "POST", "/v1/topics", {"topic": "x", "queues": 2, "brokers": ["b0"]})
        for i in range(60):
            b = await write_through(c, live, "PUT", "/v1/topics/x/config", {"a": str(i)})
        version = b["version"]

        async def logs_cut_past_the_follower():
            # Both live logs now start after the follower's last entry: whichever node leads when it returns, replaying
            # the log cannot catch it up, only the snapshot can.
            snaps = [snapshot_or_none(os.path.join(c.dir, name_of(c, u), "data", SNAPSHOT_FILE)) for u in live]
            return snaps if all(s is not None and s.previous.index > stopped_at + 1 for s in snaps) else None
        cut = await wait_until(logs_cut_past_the_follower, WAIT_S, "the live nodes to compact past the stopped one")

        await asyncio.to_thread(c.start, behind)

        async def same_image(at: int):
            digests = [await _digest(c, u, at) for u in c.meta_urls]
            return digests if None not in digests and len({d["commands"] for d in digests}) == 1 else None
        digests = await wait_until(lambda: same_image(version), WAIT_S,
                                   f"{behind} to apply as many commands as the live nodes")
        assert len({d["sha256"] for d in digests}) == 1, digests
        installed = snapshot_file.read(os.path.join(c.dir, behind, "data", SNAPSHOT_FILE))
        assert installed.last_applied.index >= min(s.last_applied.index for s in cut)
        # What the operator sees: the install on the node that was behind, the snapshots the others wrote.
        assert (await _snapshot_counts(c, furl))["installed"] >= 1
        for u in live:
            assert (await _snapshot_counts(c, u))["written"] >= 1, u

        # The installed image goes on to apply new commands exactly like the others.
        b = await write_through(c, [furl], "PUT", "/v1/topics/x/config", {"after": "install"})
        digests = await wait_until(lambda: same_image(b["version"]), WAIT_S, "every node to apply the next write")
        assert len({d["sha256"] for d in digests}) == 1, digests


async def _snapshot_counts(c, url: str) -> dict[str, float]:
    """stator_meta_raft_snapshots_total by kind, from the node's /metrics."""
    async with c.session.get(url + "/metrics", timeout=aiohttp.ClientTimeout(total=10.0)) as r:
        text = await r.text()
    return {sample.labels["kind"]: sample.value for family in text_string_to_metric_families(text)
            if family.name == "stator_meta_raft_snapshots" for sample in family.samples
            if sample.name == "stator_meta_raft_snapshots_total"}
