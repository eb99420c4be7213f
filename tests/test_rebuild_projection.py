"""`stator meta rebuild-projection` drops a stopped node's projection and rebuilds it from the node's own log."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import sqlalchemy as sa

from meta.raft.node import SNAPSHOT_FILE
from ops import devcluster
from tests.support import cluster as cluster_mod
from tests.support.meta_http import config_writes


async def test_rebuild_projection_from_the_log_equals_the_live_projection(tmp_path):
    async with cluster_mod.running(str(tmp_path), 3, 0, meta={"session_timeout_ms": 600_000}) as c:
        m1 = c.meta_urls[0]
        s, b, _ = await c.call("PUT", m1 + "/v1/brokers/b1", "broker", json={"address": "http://127.0.0.1:1"})
        assert s == 200, b
        s, b, _ = await c.call("POST", m1 + "/v1/topics", json={"topic": "t", "queues": 3})
        assert s == 201, b
        s, b, _ = await c.call("PUT", m1 + "/v1/topics/t/config", json={"retention": "7d"})
        assert s == 200, b
        version = b["version"]
        # m3's projection follows its applied log; wait until it has the last write.
        db = os.path.join(c.dir, "m3", "data", "projection.db")
        for _ in range(100):
            s, b, _ = await c.call("GET", c.meta_urls[2] + f"/v1/cluster?min_version={version}")
            if os.path.exists(db) and _position(db) >= version:
                break
            await asyncio.sleep(0.1)
        live = _dump(db)
        assert live["position"] == version
        assert [r["type"] for r in live["events"]] == ["BrokerRegistered", "TopicCreated", "TopicConfigChanged"]
        devcluster.stop_member(c.dir, "m3")
        _rebuild_from_own_log(c, db, version)   # the projection lost entirely: the log alone must bring it back
        assert _dump(db) == live


async def test_rebuild_projection_takes_what_the_journal_holds_beyond_the_images_window(tmp_path):
    """No snapshot yet, a journal from version 1, an image that kept only its last 50: the log alone holds every
    version (the replay trims them from the image), so a rebuild needs no peer or export."""
    window = 50
    no_snapshot = {"compaction_min_entries": 10_000_000, "compaction_min_time_s": 86_400}
    async with cluster_mod.running(str(tmp_path), 3, 0, meta={"session_timeout_ms": 600_000, "history_window": window,
                                                               "raft_tuning": no_snapshot}) as c:
        version = await config_writes(c, c.meta_urls[:1], "t", 2 * window)
        s, b, _ = await c.call("GET", c.meta_urls[2] + f"/v1/cluster?min_version={version}")
        assert s == 200, b
        devcluster.stop_member(c.dir, "m3")
        assert not os.path.exists(os.path.join(c.dir, "m3", "data", SNAPSHOT_FILE))
        db = os.path.join(c.dir, "m3", "data", "projection.db")
        _rebuild_from_own_log(c, db, version)
        assert [r["version"] for r in _dump(db)["events"]] == list(range(1, version + 1))


def _rebuild_from_own_log(c, db: str, version: int) -> None:
    """Drop m3's projection (stopped node) and rebuild it with no peer or export: it must reach ``version``."""
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(db + suffix):
            os.remove(db + suffix)
    out = subprocess.run([sys.executable, "-m", "ops.cli", "meta", "rebuild-projection", "--config",
                          os.path.join(c.dir, "m3", "config.json")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"rebuilt": True, "position": version, "from_source": 0}


def _position(db: str) -> int:
    try:
        with sa.create_engine(f"sqlite:///{db}").connect() as conn:
            return conn.execute(sa.text("select version from projection_position")).scalar() or 0
    except sa.exc.OperationalError:
        return 0


def _dump(db: str) -> dict:
    eng = sa.create_engine(f"sqlite:///{db}")
    with eng.connect() as conn:
        out = {"position": conn.execute(sa.text("select version from projection_position")).scalar()}
        for table, order in (("events", "version"), ("topics", "topic"), ("segments", "topic, queue, gen"),
                             ("brokers", "broker"), ("slot_ranges", "topic, lo")):
            out[table] = [dict(r._mapping) for r in conn.execute(sa.text(f"select * from {table} order by {order}"))]
    eng.dispose()
    return out
