"""The whole history, always (issue 8 part 0): no event is lost while a node's projection or an export holds it.

Real three-node clusters with a history window of 50 events (``history_window``), so the image forgets most of the
log and compaction cuts the Raft log short:
- a follower that installs a snapshot past its projection fills the gap from its peers, then its /v1/history
  answers every version 1..N contiguous (the old ones from its projection), equal to the leader's event by event,
  and an export from that node passes the export's contiguity check;
- a node whose projection lacks the old versions refuses them by name (503 HISTORY_UNAVAILABLE) while no peer can
  give them, reports the gap in /readyz and /metrics, and fills it once a peer is back;
- ``stator meta rebuild-projection`` on a stopped node takes what its log lacks from a peer or from an export.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest
import sqlalchemy as sa

from client.admin import AdminClient
from meta.raft import snapshot_file
from meta.export.exporter import export
from meta.projection import SqlProjection
from meta.projection import schema as projection_schema
from meta.raft.node import SNAPSHOT_FILE
from ops import devcluster
from tests.support import cluster as cluster_mod
from tests.support.meta_http import (cluster_status, name_of, node_urls, snapshot_or_none, wait_until,
                                write_through)
from tests.support.pg import create_database, pg_url  # noqa: F401  (pg_url is a fixture)

WINDOW = 50
CONFIG = {"history_window": WINDOW, "session_timeout_ms": 600_000,
          "raft_tuning": {"compaction_min_entries": 20, "compaction_min_time_s": 1}}
WRITES = 3 * WINDOW           # the image keeps about a third of the log
WAIT_S = 60.0            # generous: a loaded 2-core machine meets it; the runs here take seconds
CLI_TIMEOUT_S = 120


async def _fill_log(c, urls: list[str]) -> int:
    """A topic and WRITES config changes through ``urls``; returns the last version."""
    await write_through(c, urls, "POST", "/v1/topics", {"topic": "x", "queues": 2, "brokers": ["b0"]})
    b = None
    for i in range(WRITES):
        b = await write_through(c, urls, "PUT", "/v1/topics/x/config", {"a": str(i)})
    return b["version"]


async def _history(c, url: str, topic: str | None = None) -> list[dict]:
    """Every event one node's /v1/history gives, through the client's history reader (that node only)."""
    async with AdminClient([url], c.token("client"), monotonic_reads=False) as admin:
        # Pages of 37: they line up with nothing, so pages cross from the projection into the image.
        return [e async for e in admin.iter_history(after=0, topic=topic, page=37)]


async def _complete(c, url: str, version: int) -> dict | None:
    """The node's /readyz once it applied ``version`` and its projection reached it with no gap."""
    s, b, _ = await c.call("GET", url + "/readyz", None, timeout_s=2.0)
    if (b and b.get("applied_version", 0) >= version and b["projection_complete"]
            and b["projection_position"] >= version):
        return b
    return None


def _assert_whole(events: list[dict], version: int, reference: list[dict] | None = None) -> None:
    assert [e["version"] for e in events[:version]] == list(range(1, version + 1))
    if reference is not None:
        assert events[:version] == reference[:version]


def _gap_gauge(metrics_text: str) -> float:
    line = next(x for x in metrics_text.splitlines() if x.startswith("stator_meta_projection_gap_versions "))
    return float(line.split()[1])


@pytest.mark.postgres
async def test_a_follower_that_installs_a_snapshot_fills_its_projection_from_peers(tmp_path, pg_url):
    async with cluster_mod.running(str(tmp_path), 3, 0, meta=CONFIG) as c:
        _leader, lurl, followers = await node_urls(c)
        await write_through(c, c.meta_urls, "PUT", "/v1/brokers/b0", {"address": "http://127.0.0.1:1"}, role="broker")
        behind = name_of(c, followers[0])
        furl = c.url(behind)
        live = [u for u in c.meta_urls if u != furl]
        await asyncio.to_thread(devcluster.stop_member, c.dir, behind)
        # It comes back on a PostgreSQL projection, empty: the whole gap, 1 up to its image, comes from its peers.
        pg_projection = create_database(pg_url)
        _set_projection_url(os.path.join(c.dir, behind, "config.json"), pg_projection)
        stopped_at = max([(await cluster_status(c, u))["commit_index"] for u in live])
        version = await _fill_log(c, live)

        # Both the log and the image must have moved past the stopped node: a snapshot taken early in the fill cuts
        # the log but still holds version 1 in its history, and installing that one opens no gap. Until then, one
        # more write a round: a node compacts only after compaction_min_entries more.
        async def logs_cut_past_the_follower():
            nonlocal version
            snaps = [snapshot_or_none(os.path.join(c.dir, name_of(c, u), "data", SNAPSHOT_FILE)) for u in live]
            if all(s is not None and s.previous.index > stopped_at + 1 and s.image["history_start"] > WINDOW
                   for s in snaps):
                return True
            version = (await write_through(c, live, "PUT", "/v1/topics/x/config", {"a": "more"}))["version"]
            return False
        await wait_until(logs_cut_past_the_follower, WAIT_S, "the live nodes to compact past the stopped one's history")

        await asyncio.to_thread(c.start, behind)
        ready = await wait_until(lambda: _complete(c, furl, version), WAIT_S, f"{behind}'s projection to fill its gap")
        assert ready["projection_gap_versions"] == 0
        installed = snapshot_file.read(os.path.join(c.dir, behind, "data", SNAPSHOT_FILE))
        # Its image starts well after version 1: the old versions it now serves come from its projection.
        assert installed.image["history_window"] == WINDOW
        assert installed.image["history_start"] > WINDOW, installed.image["history_start"]
        log_text = _log_text(c, behind)
        assert "projection_gap" in log_text and "projection_filled" in log_text
        for name in (name_of(c, u) for u in live):
            assert "projection_gap" not in _log_text(c, name), f"{name} lost history it had applied"

        reference = await _history(c, lurl)
        _assert_whole(reference, version)
        _assert_whole(await _history(c, furl), version, reference)
        _assert_whole(_projection_events(pg_projection), version, reference)
        # A topic's events, filtered in the projection and then in the image, with nothing left out at the seam.
        assert await _history(c, furl, "x") == [e for e in reference if e["topic"] == "x"]
        s, text, _ = await c.call("GET", furl + "/metrics", None)
        assert s == 200 and _gap_gauge(text) == 0

        # An export from the node that filled its gap passes the export's contiguity check.
        result = await export([furl], c.token("client"), str(tmp_path / "export"))
        assert result.exported_after == 0 and result.last_version >= version


async def test_old_history_is_refused_by_name_until_a_peer_fills_it_and_rebuilds_take_it_from_peer_or_export(
        tmp_path):
    async with cluster_mod.running(str(tmp_path), 3, 0, meta=CONFIG) as c:
        _leader, lurl, followers = await node_urls(c)
        await write_through(c, c.meta_urls, "PUT", "/v1/brokers/b0", {"address": "http://127.0.0.1:1"}, role="broker")
        version = await _fill_log(c, c.meta_urls)
        for u in c.meta_urls:
            await wait_until(lambda u=u: _complete(c, u, version), WAIT_S, f"{u}'s projection to reach {version}")
        # Projections open seconds after the node, while the window of 50 trims: what it trimmed meanwhile was kept
        # on the node for its projection, so none of them had to ask a peer (no gap ever opened).
        for name in (name_of(c, u) for u in c.meta_urls):
            assert "projection_gap" not in _log_text(c, name), f"{name} lost history it had applied"
        reference = await _history(c, lurl)
        _assert_whole(reference, version)
        out = str(tmp_path / "export")
        assert (await export([lurl], c.token("client"), out)).last_version >= version

        # A stopped node without its projection: rebuilt from its own log alone, it would miss the oldest versions.
        # Its log lacks them only once its snapshot starts past version 1: a restart from an older snapshot replays
        # the journal from there, and the node fills its projection from that replay without asking anyone.
        name = name_of(c, followers[0])
        url = c.url(name)
        snapshot_path = os.path.join(c.dir, name, "data", SNAPSHOT_FILE)

        async def snapshot_past_version_1():
            snap = snapshot_or_none(snapshot_path)
            return snap if snap is not None and snap.image["history_start"] > 1 else None
        await wait_until(snapshot_past_version_1, WAIT_S, f"{name} to snapshot past version 1")
        cfg = os.path.join(c.dir, name, "config.json")
        db = os.path.join(c.dir, name, "data", "projection.db")
        await asyncio.to_thread(devcluster.stop_member, c.dir, name)
        refused = _rebuild(cfg)
        assert refused.returncode == 1 and "--from-peer" in refused.stderr and "versions 1.." in refused.stderr
        for source in (["--from-peer", lurl, "--token", c.token("client")], ["--from-export", out]):
            _drop(db)
            done = _rebuild(cfg, *source)
            assert done.returncode == 0, done.stderr
            assert '"rebuilt": true' in done.stdout
            _assert_whole(_projection_events(f"sqlite:///{db}"), version, reference)

        # The node comes back without a projection while no peer runs: old history is refused by name, never skipped.
        _drop(db)
        others = [n for n in (name_of(c, u) for u in c.meta_urls) if n != name]
        for other in others:
            await asyncio.to_thread(devcluster.stop_member, c.dir, other)
        await asyncio.to_thread(devcluster.start, c.dir, name, False)

        async def refused_by_name():
            s, b, _ = await c.call("GET", url + "/v1/history?after=0", "client", timeout_s=2.0)
            return (s, b) if s == 503 else None
        s, b = await wait_until(refused_by_name, WAIT_S, f"{name} to answer history")
        assert b["error"]["code"] == "HISTORY_UNAVAILABLE", b
        missing = b["error"]["details"]
        assert missing["missing_first"] == 1 and missing["missing_last"] > WINDOW, missing
        _s, ready, _ = await c.call("GET", url + "/readyz", None)
        assert ready["projection_gap_versions"] == missing["missing_last"] and not ready["projection_complete"]
        s, text, _ = await c.call("GET", url + "/metrics", None)
        assert _gap_gauge(text) == missing["missing_last"]
        # What the image holds is still served: the newest versions.
        s, b, _ = await c.call("GET", url + f"/v1/history?after={missing['missing_last']}", "client")
        assert s == 200 and b["events"][0]["version"] == missing["missing_last"] + 1

        for other in others:
            await asyncio.to_thread(devcluster.start, c.dir, other, False)
        await wait_until(lambda: _complete(c, url, version), WAIT_S, f"{name}'s projection to fill from its peers")
        _assert_whole(await _history(c, url), version, reference)

        # A hole that older code left inside a projection: served up to it, refused inside it, nothing dropped.
        await asyncio.to_thread(devcluster.stop_member, c.dir, name)
        _delete_events(f"sqlite:///{db}", range(10, 13))
        await asyncio.to_thread(devcluster.start, c.dir, name)

        async def projection_open():
            _s, b, _ = await c.call("GET", url + "/readyz", None, timeout_s=2.0)
            return b if b and b["projection_position"] >= version else None
        ready = await wait_until(projection_open, WAIT_S, f"{name} to open its projection")
        assert ready["projection_gap_versions"] >= 3 and not ready["projection_complete"]
        s, b, _ = await c.call("GET", url + "/v1/history?after=0&limit=1000", "client")
        assert s == 200 and [e["version"] for e in b["events"]] == list(range(1, 10)) and b["next_after"] == 9
        s, b, _ = await c.call("GET", url + "/v1/history?after=9", "client")
        assert s == 503 and b["error"]["code"] == "HISTORY_UNAVAILABLE" and b["error"]["details"]["missing_first"] == 10
        assert "projection_has_holes" in _log_text(c, name)
        assert len(_projection_events(f"sqlite:///{db}")) == version - 3


def _log_text(c, name: str) -> str:
    with open(os.path.join(c.dir, "logs", f"{name}.log")) as f:
        return f.read()


def _rebuild(cfg: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ops.cli", "meta", "rebuild-projection", "--config", cfg, *extra],
                          capture_output=True, text=True, timeout=CLI_TIMEOUT_S)


def _drop(db: str) -> None:
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(db + suffix):
            os.remove(db + suffix)


def _delete_events(projection_url: str, versions) -> None:
    engine = sa.create_engine(projection_url, poolclass=sa.NullPool)
    try:
        with engine.begin() as conn:
            conn.execute(sa.delete(projection_schema.events).where(projection_schema.events.c.version.in_(versions)))
    finally:
        engine.dispose()


def _set_projection_url(config_path: str, projection_url: str) -> None:
    with open(config_path) as f:
        cfg = json.load(f)
    cfg["projection_url"] = projection_url
    with open(config_path, "w") as f:
        json.dump(cfg, f)


def _projection_events(projection_url: str) -> list[dict]:
    projection = SqlProjection(projection_url)
    try:
        events: list[dict] = []
        while page := projection.history(after=events[-1]["version"] if events else 0, limit=1000):
            events.extend(page)
        return events
    finally:
        projection.close()
