"""Start-up that cannot succeed fails fast and says why: a port in use, a member of `dev up` that does not start."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from ops import devcluster
from tests.support.config_files import broker_raw, meta_raw, write

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXIT_WITHIN_S = 10.0       # a node whose port is taken must be gone by then
DEV_UP_WITHIN_S = 45.0     # `dev up` with a member that exits must give up well before its 60 s ready timeout
GONE_WITHIN_S = 5.0


@contextlib.contextmanager
def port_taken(port: int):
    """Another process's listener on 127.0.0.1:port. SO_REUSEADDR as free_base_port checks (a port it finds free may
    be in TIME_WAIT); a listener holds its port against every other bind, SO_REUSEADDR or not."""
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.bind(("127.0.0.1", port))
    holder.listen()
    try:
        yield
    finally:
        holder.close()


def serve(kind: str, config_path: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": ROOT}
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "ops.cli", kind, "serve", "--config", config_path],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        out, err = proc.communicate(timeout=EXIT_WITHIN_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"`{kind} serve` still running after {EXIT_WITHIN_S} s (stderr tail: {err[-500:]!r})")
    assert time.monotonic() - start < EXIT_WITHIN_S
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def single_meta(tmp_path, base: int) -> str:
    http, raft = f"127.0.0.1:{base}", f"127.0.0.1:{base + 1}"
    return write(tmp_path, "m1.json", meta_raw(http=http, members=[{"node": "m1", "raft": raft,
                                                                   "url": f"http://{http}"}]))


def assert_failed_naming(r: subprocess.CompletedProcess, address: str) -> None:
    assert r.returncode not in (0, None), r
    assert "Traceback" not in r.stderr, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and address in last and "not available" in last, r.stderr


def test_meta_serve_exits_at_once_naming_a_raft_address_in_use(tmp_path):
    base = devcluster.free_base_port()
    config = single_meta(tmp_path, base)
    with port_taken(base + 1):
        r = serve("meta", config)
    assert_failed_naming(r, f"127.0.0.1:{base + 1}")


def test_meta_serve_exits_at_once_naming_an_http_address_in_use_before_joining_raft(tmp_path):
    base = devcluster.free_base_port()
    config = single_meta(tmp_path, base)
    with port_taken(base):
        r = serve("meta", config)
    assert_failed_naming(r, f"127.0.0.1:{base}")
    # The port is checked before the service starts: the node neither joined Raft nor wrote any data.
    assert not os.path.exists(os.path.join(tmp_path, "data")), os.listdir(tmp_path)


def test_broker_serve_exits_at_once_naming_an_http_address_in_use(tmp_path):
    base = devcluster.free_base_port()
    config = write(tmp_path, "b1.json", broker_raw(http=f"127.0.0.1:{base}"))
    with port_taken(base):
        r = serve("broker", config)
    assert_failed_naming(r, f"127.0.0.1:{base}")


# -- stator dev up --------------------------------------------------------------------------------------------------

def processes_of(dir_: str) -> list[int]:
    """Live processes whose command line names the cluster's directory (every member's does: --config DIR/...) or
    that run in it (every member does; one forked by ops/forkserver.py has the fork server's command line)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().decode(errors="replace")
            cwd = os.readlink(f"/proc/{entry}/cwd")
        except OSError:
            continue
        zombie = devcluster._state(entry) in (None, "Z")   # gone, or dead and waiting for its parent to reap it
        inside = cwd == dir_ or cwd.startswith(dir_ + os.sep)
        if (dir_ in cmdline or inside) and not zombie and int(entry) != os.getpid():
            found.append(int(entry))
    return found


def assert_no_process_of(dir_: str) -> None:
    deadline = time.monotonic() + GONE_WITHIN_S
    while processes_of(dir_):
        assert time.monotonic() < deadline, f"still running: {processes_of(dir_)}"
        time.sleep(0.05)


@contextlib.contextmanager
def nothing_left_behind(dir_: str):
    """Whatever the test finds, it leaves no process of its cluster running (the old code left them all)."""
    try:
        yield
    finally:
        for pid in processes_of(dir_):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_dev_up_with_a_member_that_exits_stops_every_member_and_names_its_log(tmp_path):
    base = devcluster.free_base_port()
    dir_ = os.path.join(tmp_path, "cluster")
    _, m2_raft = devcluster._meta_ports(base, 1)
    env = {**os.environ, "PYTHONPATH": ROOT}
    with nothing_left_behind(dir_), port_taken(m2_raft):
        r = subprocess.run([sys.executable, "-m", "ops.cli", "dev", "up", "--dir", dir_, "--meta", "2", "--brokers",
                            "1", "--base-port", str(base)], capture_output=True, text=True, env=env, cwd=ROOT,
                           timeout=DEV_UP_WITHIN_S)
        assert_no_process_of(dir_)
    assert r.returncode != 0 and "Traceback" not in r.stderr, r
    log = os.path.join(dir_, "logs", "m2.log")
    assert r.stderr.startswith("error: MEMBER_FAILED: m2 ") and f"log: {log}" in r.stderr, r.stderr
    assert f"127.0.0.1:{m2_raft} is not available" in r.stderr, r.stderr  # m2's own last line, carried over
    # The half-made cluster is gone (its log stays), so the next `dev up` in the same place starts afresh.
    assert sorted(os.listdir(dir_)) == ["logs"] and os.path.exists(log)


def test_dev_up_with_members_never_ready_stops_them_all_and_names_them(tmp_path):
    base = devcluster.free_base_port()
    dir_ = os.path.join(tmp_path, "cluster")
    # Elections that take far longer than the ready timeout: every node runs, none is ever ready in time.
    slow = {"raft_tuning": {"election_timeout_min_s": 30.0, "election_timeout_max_s": 31.0,
                            "connection_timeout_s": 31.0}}
    with nothing_left_behind(dir_):
        with pytest.raises(devcluster.MemberFailed) as e:
            devcluster.up(dir_, 2, 0, base, extra_meta=slow, ready_timeout_s=2.0)
        assert_no_process_of(dir_)
    for name in ("m1", "m2"):
        assert f"{name} (pid " in str(e.value) and os.path.join(dir_, "logs", f"{name}.log") in str(e.value)
    assert "was not ready after 2.0 s" in str(e.value)


GROUP_LEADER = """
import os, signal, sys, time
child = os.fork()
if child == 0:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)   # outlives its leader's SIGTERM, as a child mid-exec may
    print(os.getpid(), flush=True)
    time.sleep(60)
    os._exit(0)
time.sleep(60)
"""


def test_a_stopped_member_is_gone_only_once_its_whole_process_group_is(monkeypatch):
    """A member leads its own process group, its children in it; a child that outlives the member a moment held the
    member's sockets (its raft port, when a meta node was killed while it started its projection writer), and the
    member started again at once found them in use. Stopping waits for the whole group: a child that ignores the
    SIGTERM is killed after the stop timeout, and only then is the stop over."""
    monkeypatch.setattr(devcluster, "STOP_TIMEOUT_S", 0.5)
    leader = subprocess.Popen([sys.executable, "-c", GROUP_LEADER], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    try:
        child = int(leader.stdout.readline())
        devcluster._signal_and_wait([leader.pid], signal.SIGTERM)
        leader.wait(5)
        assert not devcluster._group_alive(leader.pid), "the child, in the member's group, is gone too"
        assert devcluster._state(child) in (None, "Z", "X")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(leader.pid, signal.SIGKILL)
