"""A node stopped between the two steps of a compaction keeps the journal entries after its snapshot.

A compaction renames the new snapshot into place (the writer), then a later tick cuts the journal to start at the
snapshot's two entries. pysyncobj's loader clears a journal that does not start with those entries: a node killed
between the two steps came back at its snapshot, with every entry after it gone from its disk, acknowledged ones
included. Here the crash state is built on a stopped node of a real cluster (its own journal, and a snapshot of its
own log at an earlier entry, as the writer leaves it), and the node is started alone: what it applies can come from
its own disk only.
"""

from __future__ import annotations

import json
import os

from meta.raft import pysyncobj_shim as shim
from meta.raft import snapshot_file
from meta.image import Image
from meta.raft.journal import read_journal
from meta.raft.entry import decode_entry
from meta.raft.node import SNAPSHOT_FILE
from meta.state_machine import StateMachine
from ops import devcluster
from tests.support import cluster as cluster_mod
from tests.support.meta_http import config_writes, wait_until

NO_COMPACTION = {"compaction_min_entries": 10_000_000, "compaction_min_time_s": 86_400}
WRITES = 30
WAIT_S = 60.0


def _snapshot_at(data_dir: str, cluster: tuple[str, ...], position: int) -> snapshot_file.Snapshot:
    """The snapshot the writer would have left of this node's log at the journal's ``position``."""
    entries = read_journal(data_dir).entries
    previous, last = entries[position - 1], entries[position]
    machine = StateMachine(Image())
    for command, _index, _term in entries[:position + 1]:
        payload = shim.envelope_bytes(command)
        if payload is not None:
            for envelope in decode_entry(payload):
                machine.apply(envelope)
    return snapshot_file.Snapshot(machine.image.data, snapshot_file.LogEntry(last[1], last[2], last[0]),
                                  snapshot_file.LogEntry(previous[1], previous[2], previous[0]), cluster)


async def test_a_node_stopped_mid_compaction_keeps_the_entries_after_its_snapshot(tmp_path):
    async with cluster_mod.running(str(tmp_path), 3, 0, meta={"session_timeout_ms": 600_000,
                                                               "raft_tuning": NO_COMPACTION}) as c:
        version = await config_writes(c, c.meta_urls[:1], "t", WRITES)
        for u in c.meta_urls:
            s, b, _ = await c.call("GET", u + f"/v1/cluster?min_version={version}")
            assert s == 200, b
        for name in ("m1", "m2", "m3"):
            devcluster.stop_member(c.dir, name)

        data_dir = os.path.join(c.dir, "m3", "data")
        with open(os.path.join(c.dir, "m3", "config.json")) as f:
            cluster = tuple(sorted(m["raft"] for m in json.load(f)["members"]))
        length = len(read_journal(data_dir).entries)
        snap = _snapshot_at(data_dir, cluster, length // 2)
        assert snap.image["version"] < version
        snapshot_file.write(os.path.join(data_dir, SNAPSHOT_FILE), snap)

        devcluster.start(c.dir, "m3", False)
        url = c.url("m3")

        async def applied_all():
            s, b, _ = await c.call("GET", url + "/readyz", None, timeout_s=2.0)
            return b if b and b.get("applied_version", 0) >= version else None
        ready = await wait_until(applied_all, WAIT_S, "m3 to apply its own journal past its snapshot")
        assert ready["applied_version"] == version
        with open(os.path.join(c.dir, "logs", "m3.log")) as f:
            assert "raft_compaction_finished_on_start" in f.read()

        # Its log is still the cluster's: with the others back, every node ends on the same image.
        for name in ("m1", "m2"):
            devcluster.start(c.dir, name, False)
        digests = {}
        for u in c.meta_urls:
            async def digest(u=u):
                s, b, _ = await c.call("GET", u + f"/v1/admin/image-digest?min_version={version}", timeout_s=5.0)
                return b if s == 200 else None
            digests[u] = (await wait_until(digest, WAIT_S, f"{u} to answer its digest"))["sha256"]
        assert len(set(digests.values())) == 1, digests
