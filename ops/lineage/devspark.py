"""Spark servers on loopback from the installed PySpark, for trying `stator lineage` against a real Spark without
installing one (and for tests/test_lineage_connect.py and tests/test_lineage_standalone.py):

- ``connect_server``: a Spark Connect server (``sc://127.0.0.1:PORT``) on a ``local[1]`` master;
- ``standalone``: a standalone master with one worker (``spark://127.0.0.1:PORT``);
- ``free_ports``: ports for a driver of theirs (``spark.driver.port``, ``spark.blockManager.port``);
- ``example_export``: a small export to ask them about.

PySpark's wheel carries Spark's jars and launch scripts (``bin/spark-class``, ``bin/spark-submit``), the Connect
server's among them: its package directory is a SPARK_HOME. Each server is a child JVM in its own process group,
stopped with it whatever way the ``with`` block ends. Every port is below the ephemeral range (as ops/devcluster.py
picks them) and on 127.0.0.1, and every wait has a deadline.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from ops import devcluster

CONNECT_SERVER = "org.apache.spark.sql.connect.service.SparkConnectServer"
CONNECT_SERVICE = "org.apache.spark.sql.connect.service.SparkConnectService"   # the name its log binds the port under
MASTER = "org.apache.spark.deploy.master.Master"
WORKER = "org.apache.spark.deploy.worker.Worker"
START_TIMEOUT_S = 300.0   # a JVM start is ~5 s on an idle machine; a loaded one took ~50 s
STOP_TIMEOUT_S = 30.0


class PortTaken(RuntimeError):
    """A port of the server was bound by someone else before the server could bind it."""


def free_ports(n: int) -> list[int]:
    """``n`` consecutive ports free now, at a random place between 20000 and the ephemeral range (a port in that range
    may be handed to an outgoing connection meanwhile). SystemRandom: processes started alike (a suite's workers)
    would otherwise draw alike."""
    low, high = 20000, devcluster.ephemeral_low() - n
    pick = random.SystemRandom()
    for _ in range(500):
        base = pick.randrange(low, high)
        if all(devcluster.port_free(base + i) for i in range(n)):
            return list(range(base, base + n))
    raise RuntimeError("no free port range")




def spark_home() -> str:
    import pyspark
    return os.path.dirname(os.path.abspath(pyspark.__file__))


def env(conf_dir: str | None = None) -> dict[str, str]:
    """The environment for Spark's scripts and for a driver: loopback only, this Python for PySpark's workers."""
    e = {**os.environ, "SPARK_HOME": spark_home(), "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable,
         "PYSPARK_DRIVER_PYTHON": sys.executable}
    # A gateway port inherited from a parent PySpark would make a child driver attach to that JVM instead.
    for inherited in ("PYSPARK_GATEWAY_PORT", "PYSPARK_GATEWAY_SECRET", "SPARK_CONF_DIR"):
        e.pop(inherited, None)
    if conf_dir:
        e["SPARK_CONF_DIR"] = conf_dir
    return e


def write_defaults(conf_dir: str, conf: Mapping[str, str]) -> str:
    """``spark-defaults.conf`` in ``conf_dir``: what every spark-submit (and PySpark driver) with that SPARK_CONF_DIR
    starts with."""
    os.makedirs(conf_dir, exist_ok=True)
    with open(os.path.join(conf_dir, "spark-defaults.conf"), "w") as f:
        f.writelines(f"{k} {v}\n" for k, v in conf.items())
    return conf_dir


def script(name: str) -> str:
    return os.path.join(spark_home(), "bin", name)


@dataclass
class Server:
    name: str
    proc: subprocess.Popen
    log: str

    def tail(self, lines: int = 30) -> str:
        with contextlib.suppress(OSError), open(self.log, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
        return ""


@contextlib.contextmanager
def started(name: str, argv: list[str], workdir: str, port: int, service: str,
            environ: Mapping[str, str] | None = None, timeout_s: float = START_TIMEOUT_S) -> Iterator[Server]:
    """``argv`` started in ``workdir`` (its log: ``workdir/NAME.log``), yielded once its log says that its
    ``service`` listens on ``port``: a port that merely answers could be another process's (a JVM takes long enough
    to start that someone else may take the port first)."""
    if not devcluster.port_free(port):
        raise PortTaken(f"{name}: port {port} is taken")
    os.makedirs(workdir, exist_ok=True)
    log = os.path.join(workdir, f"{name}.log")
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, cwd=workdir, env=dict(environ or env()), stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    server = Server(name, proc, log)
    try:
        _wait_started(server, f"Successfully started service '{service}' on port {port}.", timeout_s)
        yield server
    finally:
        stop(server)


def _wait_started(server: Server, line: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        with open(server.log, errors="replace") as f:
            if line in f.read():
                return
        if server.proc.poll() is not None:
            said = server.tail()
            # Spark is told not to move to the next port (spark.port.maxRetries=0): a taken port ends the JVM.
            cls = PortTaken if "BindException" in said or "Address already in use" in said else RuntimeError
            raise cls(f"{server.name} exited with {server.proc.returncode}:\n{said}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{server.name}: no '{line}' after {timeout_s:.0f} s:\n{server.tail()}")
        time.sleep(0.5)


def stop(server: Server) -> None:
    """SIGTERM to the server's process group (spark-class execs the JVM, which may have children), then SIGKILL."""
    for sig, wait_s in ((signal.SIGTERM, STOP_TIMEOUT_S), (signal.SIGKILL, STOP_TIMEOUT_S)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.proc.pid, sig)
        try:
            server.proc.wait(wait_s)
            break
        except subprocess.TimeoutExpired:
            continue
    # The JVM is gone; children of its group (a worker's executors) go with the SIGKILL of the group.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.proc.pid, signal.SIGKILL)


ATTEMPTS = 3   # a port taken between its check and the JVM's bind: start again elsewhere


@contextlib.contextmanager
def connect_server(workdir: str, timeout_s: float = START_TIMEOUT_S) -> Iterator[str]:
    """A Spark Connect server on ``local[1]``, every port of it on 127.0.0.1 below the ephemeral range; yields its
    ``sc://`` URL."""
    yielded = False
    for attempt in range(ATTEMPTS):
        port, driver_port, block_manager_port = free_ports(3)
        argv = [script("spark-submit"), "--class", CONNECT_SERVER, "--name", "stator-devspark-connect",
                "--master", "local[1]", "--driver-memory", "512m", "--conf", "spark.port.maxRetries=0",
                "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
                "--conf", f"spark.connect.grpc.binding.port={port}",
                "--conf", f"spark.driver.port={driver_port}", "--conf", f"spark.blockManager.port={block_manager_port}",
                "--conf", "spark.ui.enabled=false", "--conf", "spark.sql.shuffle.partitions=2",
                "--conf", "spark.sql.session.timeZone=UTC",
                "--conf", f"spark.sql.warehouse.dir={os.path.join(workdir, 'warehouse')}"]
        try:
            with started("connect-server", argv, workdir, port, CONNECT_SERVICE, timeout_s=timeout_s):
                yielded = True
                yield f"sc://127.0.0.1:{port}"
                return
        except PortTaken:
            if yielded or attempt == ATTEMPTS - 1:
                raise


@dataclass
class Standalone:
    url: str          # spark://127.0.0.1:PORT
    ui: str           # the master's web UI (its JSON: ui + "/json/")
    master: Server
    worker: Server


@contextlib.contextmanager
def standalone(workdir: str, cores: int = 1, memory: str = "1g",
               timeout_s: float = START_TIMEOUT_S) -> Iterator[Standalone]:
    """A standalone master and one worker (``cores``, ``memory`` for its executors) on 127.0.0.1, their ports and
    web UIs' below the ephemeral range; the master's REST submission port (6066, fixed) is off."""
    yielded = False
    for attempt in range(ATTEMPTS):
        master_port, master_ui_port, worker_port, worker_ui_port = free_ports(4)
        url = f"spark://127.0.0.1:{master_port}"
        daemons = {**env(), "SPARK_DAEMON_MEMORY": "256m", "SPARK_WORKER_DIR": os.path.join(workdir, "work"),
                   "SPARK_DAEMON_JAVA_OPTS": "-Dspark.port.maxRetries=0",
                   "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false"}
        spark_class = script("spark-class")
        master_argv = [spark_class, MASTER, "--host", "127.0.0.1", "--port", str(master_port),
                       "--webui-port", str(master_ui_port)]
        worker_argv = [spark_class, WORKER, "--host", "127.0.0.1", "--port", str(worker_port),
                       "--webui-port", str(worker_ui_port), "--cores", str(cores), "--memory", memory,
                       "--work-dir", daemons["SPARK_WORKER_DIR"], url]
        try:
            with started("master", master_argv, workdir, master_port, "sparkMaster", daemons, timeout_s) as master, \
                    started("worker", worker_argv, workdir, worker_port, "sparkWorker", daemons, timeout_s) as worker:
                cluster = Standalone(url, f"http://127.0.0.1:{master_ui_port}", master, worker)
                # The worker listens before it has registered: an application submitted then would wait for resources.
                deadline = time.monotonic() + timeout_s
                while not [w for w in master_state(cluster).get("workers", []) if w.get("state") == "ALIVE"]:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"no worker registered after {timeout_s:.0f} s:\n{worker.tail()}")
                    time.sleep(0.5)
                yielded = True
                yield cluster
                return
        except PortTaken:
            if yielded or attempt == ATTEMPTS - 1:
                raise


def master_state(cluster: Standalone) -> dict:
    """The master's own account of its workers and applications (its web UI's JSON)."""
    try:
        with urllib.request.urlopen(f"{cluster.ui}/json/", timeout=10) as r:
            return json.load(r)
    except (OSError, ValueError):
        return {}


def example_export(out: str):
    """A small export written by the exporter's own writer: topic ``t``, two queues (b1, b2) each remapped once (queue
    0 after 10 messages, queue 1 after 4), and in group ``g`` a lock on t/1 held by m1 (released), then by m2 (left).
    Returns its ops.bench.lineage_events.History."""
    from meta.export import exporter
    from ops.bench.lineage_events import History
    h = History()
    h.create_topic("t", ["b1", "b2"], 2)
    h.remap("t", 0, "b2", written=10)
    h.remap("t", 1, "b1", written=4)
    first = h.grant("g", "t", 1, "m1")
    h.release("g", "t", 1, "m1", first)
    second = h.grant("g", "t", 1, "m2")
    h.release("g", "t", 1, "m2", second, reason="left")
    exporter.write_stored(out, h.events)
    return h
