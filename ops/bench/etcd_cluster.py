"""A throw-away 3-member etcd on loopback for side-by-side benchmarks (ops/bench/vs_etcd.py).

Debian's ``etcd-server`` package provides the binary; it is installed when missing (as root), else the exact
command is named and the benchmark stops. Members run in their own sessions with their own data dirs in a temp
dir, on ports below the ephemeral range, and are always stopped and removed, whatever happens.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

from ops import devcluster

from .common import say

ETCD_BINARY = "etcd"
INSTALL_COMMAND = ["apt-get", "install", "-y", "etcd-server"]
INSTALL_TIMEOUT_S = 600.0
MEMBERS = 3
READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
PROBE_TIMEOUT_S = 1.0


class EtcdMissing(RuntimeError):
    pass


def ensure_installed() -> str:
    """The path of the etcd binary, installing Debian's etcd-server first if it is missing and we are root."""
    found = shutil.which(ETCD_BINARY)
    if found:
        return found
    if os.geteuid() != 0:
        raise EtcdMissing(f"etcd is not installed; run as root: {' '.join(INSTALL_COMMAND)}")
    say(f"etcd: not found, running {' '.join(INSTALL_COMMAND)}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    done = subprocess.run(INSTALL_COMMAND, env=env, stdout=sys.stderr, stderr=sys.stderr, timeout=INSTALL_TIMEOUT_S)
    found = shutil.which(ETCD_BINARY)
    if done.returncode != 0 or not found:
        raise EtcdMissing(f"{' '.join(INSTALL_COMMAND)} failed (exit {done.returncode}); install etcd-server by hand")
    return found


def b64(s: str) -> str:
    return base64.b64encode(s.encode()).decode()


class EtcdCluster:
    def __init__(self, binary: str, dir_: str, base_port: int):
        self.binary, self.dir = binary, dir_
        self.names = [f"e{i + 1}" for i in range(MEMBERS)]
        self.client_port = {n: base_port + 2 * i for i, n in enumerate(self.names)}
        self.peer_port = {n: base_port + 2 * i + 1 for i, n in enumerate(self.names)}
        self.procs: dict[str, subprocess.Popen] = {}

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.client_port[name]}"

    def _argv(self, name: str, state: str) -> list[str]:
        peers = ",".join(f"{n}=http://127.0.0.1:{self.peer_port[n]}" for n in self.names)
        return [self.binary, "--name", name, "--data-dir", os.path.join(self.dir, name),
                "--listen-client-urls", self.url(name), "--advertise-client-urls", self.url(name),
                "--listen-peer-urls", f"http://127.0.0.1:{self.peer_port[name]}",
                "--initial-advertise-peer-urls", f"http://127.0.0.1:{self.peer_port[name]}",
                "--initial-cluster", peers, "--initial-cluster-state", state,
                "--initial-cluster-token", "stator-bench", "--log-level", "warn", "--logger", "zap"]

    def start(self, name: str, state: str = "new") -> None:
        os.makedirs(os.path.join(self.dir, "logs"), exist_ok=True)
        with open(os.path.join(self.dir, "logs", f"{name}.log"), "ab") as log:
            self.procs[name] = subprocess.Popen(self._argv(name, state), stdout=log, stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL, start_new_session=True)

    def wait_ready(self, names: list[str] | None = None, timeout_s: float = READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        for name in names or self.names:
            while not self._healthy(name):
                if self.procs[name].poll() is not None:
                    raise RuntimeError(f"etcd {name} exited ({self.procs[name].returncode}); see {self.dir}/logs")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"etcd {name} not healthy within {timeout_s} s")
                time.sleep(0.1)

    def _healthy(self, name: str) -> bool:
        try:
            with urllib.request.urlopen(self.url(name) + "/health", timeout=PROBE_TIMEOUT_S) as r:
                return json.loads(r.read()).get("health") == "true"
        except (OSError, ValueError, urllib.error.URLError):
            return False

    def status(self, name: str) -> dict[str, Any] | None:
        req = urllib.request.Request(self.url(name) + "/v3/maintenance/status", data=b"{}", method="POST")
        try:
            with urllib.request.urlopen(req, timeout=PROBE_TIMEOUT_S) as r:
                return json.loads(r.read())
        except (OSError, ValueError, urllib.error.URLError):
            return None

    def leader(self, timeout_s: float = READY_TIMEOUT_S) -> str:
        """The member every live member names as leader (a member just restarted may not know it yet)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            statuses = {name: self.status(name) for name in self.names if self.alive(name)}
            ids = {name: st["header"]["member_id"] for name, st in statuses.items() if st}
            named = {st.get("leader") for st in statuses.values() if st}
            if statuses and len(ids) == len(statuses) and len(named) == 1:
                lead = named.pop()
                for name, member_id in ids.items():
                    if member_id == lead:
                        return name
            time.sleep(0.05)
        raise TimeoutError("etcd has no agreed leader")

    def term(self) -> int:
        """The highest raft term any live member reports (0 if none answers)."""
        terms = [int(st.get("raftTerm", 0)) for st in (self.status(n) for n in self.names if self.alive(n)) if st]
        return max(terms, default=0)

    def alive(self, name: str) -> bool:
        p = self.procs.get(name)
        return p is not None and p.poll() is None

    def pid(self, name: str) -> int | None:
        p = self.procs.get(name)
        return p.pid if p is not None else None

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        p = self.procs[name]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, sig)
        p.wait(STOP_TIMEOUT_S)

    def stop_all(self) -> None:
        for name, p in self.procs.items():
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGTERM)
        for name, p in self.procs.items():
            try:
                p.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait(STOP_TIMEOUT_S)


@contextlib.contextmanager
def temp_etcd(binary: str) -> Iterator[EtcdCluster]:
    d = tempfile.mkdtemp(prefix="stator-bench-etcd-")
    base = devcluster.free_base_port()
    c = EtcdCluster(binary, d, base)
    say(f"etcd: starting {MEMBERS} members in {d} on ports {base}..{base + 2 * MEMBERS - 1}")
    try:
        for name in c.names:
            c.start(name)
        c.wait_ready()
        say(f"etcd: ready, leader {c.leader()}")
        yield c
    finally:
        say("etcd: stopping")
        c.stop_all()
        shutil.rmtree(d, ignore_errors=True)
