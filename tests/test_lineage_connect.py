"""`stator lineage --remote sc://...` against a real Spark Connect server (issue 21, item 3), and a package of the
`spark` extra that is missing said in one line, whatever the master.

The server is the installed PySpark's own (ops/lineage/devspark.py), one JVM; the answers it gives the CLI, run as the
`stator` script in a child process that starts no JVM, must equal the local run's on the shared session
(tests/conftest.py ``spark``). The missing-package and unreachable-server cases start no JVM at all. The export is hand-built by the exporter's own writer (devspark.example_export): the
Spark side is under test here, tests/test_lineage_spark.py checks the answers against a real cluster's history.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from ops.lineage import devspark, run
from ops.lineage.errors import INSTALL
from tests.support.stator_cli import STATOR

CLI_TIMEOUT_S = 300.0    # one command: a Python start and a few Spark jobs, on a loaded 2-core machine

# A `sitecustomize` on PYTHONPATH, run by the child's interpreter at start-up: the modules named in STATOR_TEST_BLOCK
# cannot be imported, exactly as if their package had not been installed.
BLOCKER = """\
import importlib.abc, os, sys

BLOCKED = set(filter(None, os.environ.get("STATOR_TEST_BLOCK", "").split(",")))


class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, NotInstalled())
"""


@pytest.fixture(scope="module")
def export(tmp_path_factory) -> str:
    out = str(tmp_path_factory.mktemp("connect") / "export")
    devspark.example_export(out)
    return out


def stator(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([STATOR, *args], env=env or devspark.env(), cwd=os.getcwd(), capture_output=True,
                          text=True, timeout=CLI_TIMEOUT_S, stdin=subprocess.DEVNULL)


COMMANDS = {   # the command's arguments, and its request for run.run_on
    "locate": (["--topic", "t", "--queue", "0", "--offset", "12"], {"topic": "t", "queue": 0, "offset": 12}),
    "moves": ([], {"topic": None, "broker": None, "since": None}),
    "locks": (["--group", "g"], {"group": "g", "topic": None, "queue": None}),
    "verify": ([], {}),
}


@pytest.mark.long(seconds=55)   # its module alone, measured on 2 cores (tests/conftest.py)
@pytest.mark.slow
@pytest.mark.timeout(900)   # a JVM start and four commands: minutes on a 2-core machine running the suite beside
def test_remote_answers_equal_the_local_runs(spark, export, tmp_path):
    local = {c: run.run_on(spark, run.Request(c, export, args=a)) for c, (_, a) in COMMANDS.items()}
    assert local["locate"]["gen"] == 1 and len(local["moves"]["moves"]) == 2 and len(local["locks"]["locks"]) == 2
    assert local["verify"] == []
    started = time.monotonic()
    with devspark.connect_server(str(tmp_path / "connect")) as url:
        print(f"connect server up in {time.monotonic() - started:.1f} s at {url}")
        for command, (argv, _) in COMMANDS.items():
            t0 = time.monotonic()
            said = stator("lineage", command, "--data", export, "--remote", url, "--json", *argv)
            print(f"{command} over Spark Connect: {time.monotonic() - t0:.1f} s")
            assert said.returncode == 0, (command, said.stdout, said.stderr[-3000:])
            assert json.loads(said.stdout) == local[command], command
        # The server reads the export from its own disks: a path it does not have is its answer, in one line.
        nowhere = stator("lineage", "moves", "--data", str(tmp_path / "nowhere"), "--remote", url)
        assert nowhere.returncode == 1 and nowhere.stderr.startswith("error: EXPORT_NOT_FOUND: no export at ") and \
            nowhere.stderr.count("\n") == 1, nowhere.stderr[-3000:]
        # An error of the export (not of Spark) is the same one line remotely.
        missing = stator("lineage", "locate", "--data", export, "--remote", url, "--topic", "nope", "--queue", "0",
                         "--offset", "0")
        assert missing.returncode == 1 and missing.stdout == "", missing.stderr[-3000:]
        assert missing.stderr.startswith("error: TOPIC_NOT_FOUND: ") and missing.stderr.count("\n") == 1, \
            missing.stderr[-3000:]


def test_no_server_at_the_remote_is_one_error_line_at_once(export):
    # PySpark's client alone retries an unreachable server for about ten minutes, then prints a traceback.
    port, = devspark.free_ports(1)
    said = stator("lineage", "moves", "--data", export, "--remote", f"sc://127.0.0.1:{port}")
    assert (said.returncode, said.stdout) == (1, ""), said.stderr[-3000:]
    assert said.stderr == f"error: UNAVAILABLE: no Spark Connect server at 127.0.0.1:{port} (Connection refused)\n"
    bad = stator("lineage", "moves", "--data", export, "--remote", "http://127.0.0.1:15002")
    assert bad.returncode == 1 and bad.stderr.startswith("error: INVALID_ARGUMENT: --remote http://"), bad.stderr


@pytest.mark.parametrize("blocked, where, package", [
    ("grpc", ["--remote", "sc://127.0.0.1:1"], "grpcio"),           # Spark Connect's client, checked by PySpark
    ("zstandard", ["--remote", "sc://127.0.0.1:1"], "zstandard"),
    ("pyspark", ["--master", "spark://127.0.0.1:1"], "pyspark"),     # the driver itself
    ("pyarrow", [], "pyarrow"),                                      # a local run: the export's schema
])
def test_a_missing_package_is_one_error_line_naming_the_extra(export, tmp_path, blocked, where, package):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER)
    env = {**devspark.env(), "PYTHONPATH": str(site), "STATOR_TEST_BLOCK": blocked}
    said = stator("lineage", "moves", "--data", export, *where, env=env)
    assert (said.returncode, said.stdout) == (1, ""), said.stderr[-3000:]
    assert said.stderr.count("\n") == 1 and "Traceback" not in said.stderr, said.stderr[-3000:]
    assert said.stderr.startswith(f"error: PACKAGE_NOT_INSTALLED: {package}") and said.stderr.rstrip().endswith(
        f"install the spark extra: {INSTALL}"), said.stderr
    if blocked == "pyarrow":
        # The job says it the same way (under spark-submit as under python -m).
        job = subprocess.run([sys.executable, "-m", "ops.lineage.job", "--data", export], env=env, capture_output=True,
                             text=True, timeout=CLI_TIMEOUT_S, stdin=subprocess.DEVNULL)
        assert (job.returncode, job.stdout) == (1, "") and job.stderr.count("\n") == 1, job.stderr[-3000:]
        assert job.stderr.startswith("error: PACKAGE_NOT_INSTALLED: pyarrow"), job.stderr
