"""Fixtures shared by the integration tests: real clusters of processes on loopback."""

from __future__ import annotations

import pytest

from tests import cluster as cluster_mod


@pytest.fixture
async def meta_cluster(tmp_path):
    """Three meta nodes, no brokers; short broker sessions so expiry tests stay quick."""
    async with cluster_mod.running(str(tmp_path), 3, 0, meta={"session_timeout_ms": 3000}) as c:
        yield c


@pytest.fixture
async def full_cluster(tmp_path):
    """Three meta nodes and three brokers; 3 s broker sessions with 0.5 s heartbeats so expiry tests stay quick."""
    async with cluster_mod.running(str(tmp_path), 3, 3,
                                   meta={"session_timeout_ms": 3000, "heartbeat_interval_ms": 500}) as c:
        yield c


@pytest.fixture(scope="session")
def spark():
    """ONE local Spark session for every lineage test (a JVM start costs ~5 s): local[2], no UI, 2 shuffle partitions,
    UTC (ops/lineage/session.py sets the time zone and loopback)."""
    from ops.lineage import session
    s = session.build("local[2]", conf={"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2",
                                        "spark.sql.session.timeZone": "UTC"})
    yield s
    s.stop()
