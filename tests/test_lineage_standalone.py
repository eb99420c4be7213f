"""Lineage on a Spark standalone master with one worker (issue 21, item 3): `ops/lineage/job.py` through
`spark-submit --master spark://...` and `stator lineage --master spark://...`, each run by the master on the worker's
executor, as an operator would run them.

Master and worker are the installed PySpark's (`spark-class ... Master` / `Worker`, ops/lineage/devspark.py) on
127.0.0.1. The drivers take their ports and their executor's size from a `spark-defaults.conf` (SPARK_CONF_DIR), as
on a real install. No Spark session runs in this process: the job's tables are read back with pyarrow, and the answers
are checked against the hand-built history they came from (devspark.example_export;
tests/test_lineage_spark.py checks these queries against a real cluster's history).
"""

from __future__ import annotations

import json
import os
import subprocess
import time

import pyarrow.parquet as pq
import pytest

from ops.lineage import devspark
from tests.support.stator_cli import STATOR

CLI_TIMEOUT_S = 300.0    # one application: a driver and an executor JVM, on a loaded 2-core machine
JOB = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "ops", "lineage", "job.py")


def timed(argv: list[str], env: dict) -> subprocess.CompletedProcess:
    t0 = time.monotonic()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=CLI_TIMEOUT_S,
                          stdin=subprocess.DEVNULL)
    print(f"{os.path.basename(argv[0])} {argv[1:3]}: {time.monotonic() - t0:.1f} s")
    assert done.returncode == 0, (argv, done.stdout, done.stderr[-4000:])
    return done


# Two daemons and two applications, each a driver and an executor JVM: ~10 min on 2 cores with the suite beside.
@pytest.mark.long(seconds=70)   # its module alone, measured on 2 cores (tests/conftest.py)
@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_the_job_and_the_cli_on_a_standalone_master_with_one_worker(tmp_path):
    data, out = str(tmp_path / "export"), str(tmp_path / "derived")
    h = devspark.example_export(data)
    driver_port, block_manager_port = devspark.free_ports(2)
    conf_dir = devspark.write_defaults(str(tmp_path / "conf"), {
        "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
        # Executors take the next free port up from the block manager's (spark.port.maxRetries).
        "spark.driver.port": str(driver_port), "spark.blockManager.port": str(block_manager_port),
        "spark.ui.enabled": "false", "spark.driver.memory": "512m", "spark.executor.memory": "512m",
        "spark.cores.max": "1", "spark.sql.shuffle.partitions": "2"})
    env = devspark.env(conf_dir)
    with devspark.standalone(str(tmp_path / "spark")) as cluster:
        submitted = timed([devspark.script("spark-submit"), "--master", cluster.url, JOB, "--data", data,
                           "--out", out], env)
        assert json.loads(submitted.stdout.strip().splitlines()[-1]) == {"out": out, "segments": 4,
                                                                         "lock_intervals": 2}
        moves = timed([STATOR, "lineage", "moves", "--data", data, "--master", cluster.url, "--json"], env)
        state = devspark.master_state(cluster)

    segs = pq.read_table(f"{out}/segments").to_pylist()
    assert {(s["queue"], s["gen"], s["broker"], s["logic_start"], s["logic_end"]) for s in segs} == \
        {(0, 0, "b1", 0, 10), (0, 1, "b2", 10, None), (1, 0, "b2", 0, 4), (1, 1, "b1", 4, None)}
    locks = pq.read_table(f"{out}/lock_intervals").to_pylist()
    assert sorted((lk["member"], lk["token"], lk["reason"]) for lk in locks) == [("m1", 1, "released"),
                                                                                 ("m2", 2, "left")]
    opened = {(e["data"]["queue"], e["data"]["broker"], e["version"]) for e in h.events if e["type"] == "SegmentOpened"}
    assert {(m["queue"], m["from"], m["to"], m["gen"]) for m in json.loads(moves.stdout)["moves"]} == \
        {(0, "b1", "b2", 1), (1, "b2", "b1", 1)}
    assert {(m["queue"], m["to"], m["version"]) for m in json.loads(moves.stdout)["moves"]} == opened
    # The master ran both on its worker: nothing fell back to a local master.
    apps = sorted((a["name"], a["state"]) for a in state.get("completedapps", []))
    assert apps == [("stator-lineage", "FINISHED"), ("stator-lineage-job", "FINISHED")], state
