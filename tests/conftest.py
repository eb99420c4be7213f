"""Fixtures shared by the integration tests: real clusters of processes on loopback, and one broker node in the
test's process (its real store, offsets file, writer and reader; routes and session set by the test, as the watch
stream and the meta link would)."""

from __future__ import annotations

import os
import time

import pytest

from broker.config import BrokerConfig
from broker.node import BrokerNode
from ops import devcluster, forkserver
from tests.support import cluster as cluster_mod
from tests.support import held_follower as held_follower_mod


# Every JVM a test starts (Spark's drivers, executors, master, worker and Connect server) compiles with C1 only, on
# one compiler thread, with the serial collector: their jobs run seconds on tables of a few rows, and C2's compiling
# cost more than it won. Measured on 2 cores, each module alone: the lineage modules' machine CPU 218 s -> 129 s,
# standalone + Connect wall 130 s -> 87 s, tests/test_lineage_spark.py's wall unchanged. Production JVMs keep theirs.
TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:CICompilerCount=1 -XX:+UseSerialGC"


def pytest_configure(config):
    """The JVMs' options above. Dev-cluster members forked from a process that imported the servers once
    (ops/forkserver.py): a member's start cost 0.45-0.65 s of CPU in imports, and the suite starts about 1,200; a
    cluster of three meta nodes and three brokers now takes 1.5 s of CPU instead of 4.5. Under pytest-xdist each
    worker draws its free port ranges from a slice of its own (STATOR_PORTS): a range found free by one worker could
    otherwise be taken by another between the check and the bind."""
    os.environ.setdefault("JAVA_TOOL_OPTIONS", TEST_JVM_OPTIONS)
    forkserver.enable()
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not worker or not count:
        return
    low, high = devcluster.PORTS_LOW, devcluster.ephemeral_low()
    size = (high - low) // int(count) // devcluster.PORT_SPAN * devcluster.PORT_SPAN
    first = low + int(worker.removeprefix("gw")) * size
    os.environ[devcluster.PORTS_ENV] = f"{first}-{first + size}"


def pytest_collection_modifyitems(config, items):
    """Modules holding a test marked ``long(seconds=N)`` first, longest first, each keeping its own order: the parallel
    workers (pytest -n 3 --dist loadscope) take modules in this order, and a two-minute test started last kept one
    worker busy alone at the end. One process keeps the collection's order."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    seconds: dict[object, float] = {}
    for item in items:
        mark = item.get_closest_marker("long")
        if mark is not None:
            seconds[item.module] = max(seconds.get(item.module, 0), mark.kwargs["seconds"])
    items.sort(key=lambda item: -seconds.get(item.module, 0))


@pytest.fixture
async def meta_cluster(tmp_path):
    """Three meta nodes, no brokers; short broker sessions so expiry tests stay quick."""
    async with cluster_mod.running(str(tmp_path), 3, 0, meta={"session_timeout_ms": 3000}) as c:
        yield c


@pytest.fixture
async def held_follower(tmp_path):
    """A caught-up follower of three in-process nodes whose ticks are held: the test hands it raft messages
    (tests/support/held_follower.py)."""
    async with held_follower_mod.caught_up(tmp_path) as f:
        yield f


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


@pytest.fixture
async def broker_node(tmp_path):
    """Broker b1 with an active session and no routes yet (``node.routes.update(route)``)."""
    n = BrokerNode(BrokerConfig(broker="b1", data_dir=str(tmp_path / "b1"), http_host="127.0.0.1", http_port=1,
                                meta_urls=("http://127.0.0.1:9",), token="bt", client_token="ct"))
    n.session.epoch, n.session.state, n.session.last_ack_sent = 1, "active", time.monotonic() + 3600
    try:
        yield n
    finally:
        n.writer.stop()
        n.store.close()
        n.producer_log.close()
        n.offsets.close()
