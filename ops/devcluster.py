"""`stator dev up / start / down`: a local cluster of real processes on loopback (API.md, local cluster tool).

Layout of DIR: ``cluster.json`` (API.md shape, plus each member's config path and, for tests, ``serve_flags``: extra
flags of its serve command, such as runtime/power_loss.FLAG), ``NAME/`` data and config of each member, ``logs/NAME.log``. Processes run in their own session so `down` can signal the whole group.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

from ops import forkserver
from runtime.credentials import token_hash

PORTS_LOW = 20000
PORTS_ENV = "STATOR_PORTS"
PORT_SPAN = 100           # a cluster uses base..base+13 (meta) and base+50.. (brokers)
READY_TIMEOUT_S = 60.0
READY_POLL_INTERVAL_S = 0.1
STOP_TIMEOUT_S = 10.0
STOP_POLL_INTERVAL_S = 0.05
KILL_TIMEOUT_S = 5.0      # a SIGKILLed process is gone within this, or something is badly wrong with the machine
LOG_TAIL_BYTES = 4096     # read from the end of a failed member's log, for its last line


class DevError(RuntimeError):
    """What `stator dev` must tell its user, with a code: ``error: CODE: message``, as every other command."""
    code = "FAILED_PRECONDITION"


class MemberFailed(DevError):
    """A member exited or was not ready in time; the message names it and its log file (if it exited, the log's
    last line too)."""
    code = "MEMBER_FAILED"


class AlreadyRunning(DevError):
    """A member, or a whole cluster, that runs already: stopped first, never started twice."""
    code = "ALREADY_RUNNING"


class NoSuchMember(DevError):
    code = "NOT_FOUND"


class NoFreePorts(DevError):
    code = "UNAVAILABLE"


def free_base_port() -> int:
    """A base port whose whole span is free, below the ephemeral range: a port in that range can be handed to an
    outgoing connection, and a connect to a node not yet listening can then connect to itself (TCP self-connect)."""
    low, high = port_range()
    for _ in range(500):
        base = random.randrange(low, high - PORT_SPAN) // PORT_SPAN * PORT_SPAN
        if base >= low and all(port_free(base + i) for i in list(range(0, 14)) + list(range(50, 60))):
            return base
    raise NoFreePorts("no free port range below the ephemeral ports")


def port_range() -> tuple[int, int]:
    """The ports tests and benches bind, [low, high): from 20000 to the ephemeral range; ``STATOR_PORTS=LOW-HIGH``
    narrows it (tests/conftest.py gives each parallel test worker a slice of its own, so that two workers never
    draw the same free range between its check and its bind)."""
    low, high = PORTS_LOW, ephemeral_low()
    raw = os.environ.get(PORTS_ENV)
    if raw:
        lo, _, hi = raw.partition("-")
        low, high = max(low, int(lo)), min(high, int(hi))
    return low, high


def ephemeral_low() -> int:
    """The kernel's first ephemeral port: tests and benches bind below it (the kernel hands out the rest)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def port_free(port: int) -> bool:
    """Whether a server can bind ``port`` now. With SO_REUSEADDR, as every server of Stator binds (runtime/serve.py,
    the raft transport): a port left in TIME_WAIT by a connection that ended is free, a listener's is not. Without
    it, a machine that had just run many clusters (a mutation run) had TIME_WAIT ports in every range and found none
    free (NoFreePorts)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def _meta_ports(base: int, i: int) -> tuple[int, int]:
    return base + 2 * i, base + 2 * i + 1


def _broker_port(base: int, i: int) -> int:
    return base + 50 + i


def _spawn(dir_: str, name: str, argv: list[str]) -> int:
    os.makedirs(os.path.join(dir_, "logs"), exist_ok=True)
    if forkserver.wanted():
        return forkserver.CLIENT.spawn(argv, dir_, _log_path(dir_, name))
    log = open(_log_path(dir_, name), "ab")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True, cwd=dir_)
    log.close()
    return proc.pid


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/readyz", timeout=1.0) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def wait_ready(urls: list[str], timeout_s: float = READY_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    pending = list(urls)
    while pending:
        pending = [u for u in pending if not _ready(u)]
        if not pending:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"not ready after {timeout_s} s: {pending}")
        time.sleep(READY_POLL_INTERVAL_S)


def _wait_members(dir_: str, members: list[dict[str, Any]], timeout_s: float = READY_TIMEOUT_S) -> None:
    """Until every member answers /readyz. A member whose process exits fails the wait at once, not at the
    deadline: a config error or a port in use would otherwise cost the whole timeout."""
    deadline = time.monotonic() + timeout_s
    pending = list(members)
    while pending:
        pending = [m for m in pending if not _ready(m["url"])]
        if not pending:
            return
        dead = [m for m in pending if not _alive(m["pid"])]
        if dead:
            raise MemberFailed(_exit_report(dir_, dead[0]))
        if time.monotonic() > deadline:
            raise MemberFailed("; ".join(_failure(dir_, m, f"was not ready after {timeout_s} s") for m in pending))
        time.sleep(READY_POLL_INTERVAL_S)


def _name(member: dict[str, Any]) -> str:
    return member.get("node", member.get("broker"))


def _log_path(dir_: str, name: str) -> str:
    return os.path.join(dir_, "logs", f"{name}.log")


def _failure(dir_: str, member: dict[str, Any], what: str) -> str:
    return f"{_name(member)} (pid {member['pid']}) {what}, log: {_log_path(dir_, _name(member))}"


def _exit_report(dir_: str, member: dict[str, Any]) -> str:
    # The last line of a node that failed to start is its `error: ...` line: show it, no need to open the log.
    last = _last_line(_log_path(dir_, _name(member)))
    return _failure(dir_, member, "exited before it was ready") + (f"; its last line: {last}" if last else "")


def _last_line(path: str) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - LOG_TAIL_BYTES))
            lines = f.read().decode(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1] if lines else ""


@contextlib.contextmanager
def _stopped_on_failure(members: Callable[[], list[dict[str, Any]]]) -> Iterator[None]:
    """Whatever goes wrong (Ctrl-C too), no process started inside the block outlives the failed command.

    ``members()`` is called when the failure happens, so it sees every member spawned until then."""
    try:
        yield
    except BaseException:
        _signal_and_wait([m["pid"] for m in members()], signal.SIGTERM)
        raise


@contextlib.contextmanager
def _undone_on_failure(dir_: str, cluster: dict[str, Any], names: list[str]) -> Iterator[None]:
    """A new cluster that failed to come up leaves no process and no half-made cluster behind: were cluster.json
    kept, the next `dev up` in DIR would restart it without the members never spawned. What this call wrote
    (configs, data) goes too; the logs stay, as the error points at them."""
    try:
        with _stopped_on_failure(lambda: cluster["meta"] + cluster["brokers"]):
            yield
    except BaseException:
        for name in names:
            shutil.rmtree(os.path.join(dir_, name, "data"), ignore_errors=True)
            with contextlib.suppress(OSError):
                os.remove(os.path.join(dir_, name, "config.json"))
                os.rmdir(os.path.join(dir_, name))
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(dir_, "cluster.json"))
        raise


def _meta_argv(member: dict[str, Any]) -> list[str]:
    return [sys.executable, "-m", "ops.cli", "meta", "serve", "--config", member["config"],
            *member.get("serve_flags", [])]


def _broker_argv(member: dict[str, Any]) -> list[str]:
    return [sys.executable, "-m", "ops.cli", "broker", "serve", "--config", member["config"],
            *member.get("serve_flags", [])]


def _with_flags(member: dict[str, Any], serve_flags: list[str] | None) -> dict[str, Any]:
    return {**member, "serve_flags": list(serve_flags)} if serve_flags else member


def up(dir_: str, metas: int = 3, brokers: int = 3, base_port: int = 7100, extra_meta: dict | None = None,
       extra_broker: dict | None = None, ready_timeout_s: float = READY_TIMEOUT_S,
       serve_flags: list[str] | None = None, per_broker: dict[str, dict] | None = None) -> dict[str, Any]:
    """Start the cluster and return once every member is ready; if any is not, stop every member, undo the new
    cluster (see _undone_on_failure) and raise MemberFailed naming the member and its log. ``serve_flags`` go to every
    member's serve command, now and at every restart; ``per_broker`` adds config keys to the named brokers' (their
    cluster, say) over ``extra_broker``."""
    dir_ = os.path.abspath(dir_)
    os.makedirs(dir_, exist_ok=True)
    if os.path.exists(os.path.join(dir_, "cluster.json")):
        return restart_all(dir_, ready_timeout_s)
    tokens = {r: secrets.token_hex(16) for r in ("admin", "client")}
    broker_names = [f"b{i + 1}" for i in range(brokers)]
    broker_tokens = issue_broker_tokens(broker_names)
    secret = secrets.token_hex(24)
    members = []
    for i in range(metas):
        http, raft = _meta_ports(base_port, i)
        members.append({"node": f"m{i + 1}", "raft": f"127.0.0.1:{raft}", "url": f"http://127.0.0.1:{http}"})
    # API.md's cluster.json names one "broker_token": the first broker's own (it acts only as that broker);
    # "broker_tokens" adds every broker's.
    cluster: dict[str, Any] = {"meta": [], "brokers": [], "admin_token": tokens["admin"],
                               "broker_token": next(iter(broker_tokens.values())),
                               "client_token": tokens["client"], "broker_tokens": broker_tokens}
    hashes = {b: token_hash(t) for b, t in broker_tokens.items()}
    with _undone_on_failure(dir_, cluster, [m["node"] for m in members] + broker_names):
        for m in members:
            cfg = {"node": m["node"], "data_dir": "data", "http": m["url"].removeprefix("http://"), "secret": secret,
                   "tokens": tokens, "broker_tokens": hashes, "members": members, **(extra_meta or {})}
            member = _with_flags({"node": m["node"], "url": m["url"], "config": write_config(dir_, m["node"], cfg)},
                                 serve_flags)
            member["pid"] = _spawn(dir_, m["node"], _meta_argv(member))
            cluster["meta"].append(member)
        save(dir_, cluster)
        _wait_members(dir_, cluster["meta"], ready_timeout_s)
        for i, name in enumerate(broker_names):
            port = _broker_port(base_port, i)
            cfg = {"broker": name, "data_dir": "data", "http": f"127.0.0.1:{port}",
                   "tokens": {**tokens, "broker": broker_tokens[name]}, "broker_tokens": hashes,
                   "meta": [m["url"] for m in members], **(extra_broker or {}), **(per_broker or {}).get(name, {})}
            member = _with_flags({"broker": name, "url": f"http://127.0.0.1:{port}",
                                  "config": write_config(dir_, name, cfg)}, serve_flags)
            member["pid"] = _spawn(dir_, name, _broker_argv(member))
            cluster["brokers"].append(member)
            save(dir_, cluster)
        _wait_members(dir_, cluster["brokers"], ready_timeout_s)
    return cluster


def issue_broker_tokens(names: list[str]) -> dict[str, str]:
    """A token of its own for each broker (meta's config names each by its hash). A cluster without broker
    processes still issues one, for b1: a test or tool can then play that broker with its own credential."""
    return {b: secrets.token_hex(16) for b in (names or ["b1"])}


def add_meta(dir_: str, name: str, http_port: int, raft_port: int) -> dict[str, Any]:
    """Start one more meta node, ``name``, on the given ports: its config lists the cluster's members and itself
    (how to reach the cluster), and it joins as a learner once ``stator cluster members add`` put it in the log.
    Not waited for: a learner is not ready until it has caught up. Returns its entry in cluster.json."""
    dir_ = os.path.abspath(dir_)
    cluster = load(dir_)
    if any(_name(m) == name for m in cluster["meta"] + cluster["brokers"]):
        raise AlreadyRunning(f"{name} is already in {dir_}/cluster.json")
    with open(cluster["meta"][0]["config"]) as f:
        template = json.load(f)
    me = {"node": name, "raft": f"127.0.0.1:{raft_port}", "url": f"http://127.0.0.1:{http_port}"}
    # Every meta node this cluster ever started, each as its own config names it: the first node's list is only
    # the cluster it started with, and a node added since (m4) that leads now must be known to the new one, or the
    # new node refuses the leader's connection as an unknown node and never gets the log.
    cfg = {**template, "node": name, "http": me["url"].removeprefix("http://"),
           "members": _meta_members(cluster) + [me]}
    member = _with_flags({"node": name, "url": me["url"], "config": write_config(dir_, name, cfg)},
                         cluster["meta"][0].get("serve_flags"))
    member["pid"] = _spawn(dir_, name, _meta_argv(member))
    cluster["meta"].append(member)
    save(dir_, cluster)
    return member


def _meta_members(cluster: dict[str, Any]) -> list[dict[str, Any]]:
    members = []
    for m in cluster["meta"]:
        with open(m["config"]) as f:
            own = json.load(f)
        members += [e for e in own["members"] if e["node"] == m["node"]]
    return members


def write_config(dir_: str, name: str, cfg: dict[str, Any]) -> str:
    """A member's config.json in its own directory under ``dir_``; returns its path."""
    os.makedirs(os.path.join(dir_, name), exist_ok=True)
    path = os.path.join(dir_, name, "config.json")
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2)
    return path


def save(dir_: str, cluster: dict[str, Any]) -> None:
    """The cluster's cluster.json, replaced atomically (what ``load`` and the stop/start commands read)."""
    tmp = os.path.join(dir_, "cluster.json.tmp")
    with open(tmp, "w") as f:
        json.dump(cluster, f, indent=2)
    os.replace(tmp, os.path.join(dir_, "cluster.json"))


def load(dir_: str) -> dict[str, Any]:
    with open(os.path.join(os.path.abspath(dir_), "cluster.json")) as f:
        return json.load(f)


def _exists(send_signal: Callable[[int, int], None], target: int) -> bool:
    """Whether ``target`` exists, asked with signal 0 (nothing is sent) through ``send_signal``: os.kill for a
    process, os.killpg for a process group. Another user's answers PermissionError: it exists."""
    try:
        send_signal(target, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _alive(pid: int) -> bool:
    if not _exists(os.kill, pid):
        return False
    try:  # a zombie child of ours counts as dead
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == 0
    except ChildProcessError:
        pass
    # Another process's zombie (a killed member whose parent, maybe init, has not reaped it yet) still answers
    # kill 0: `dev start` called such a member "already running" and started nothing
    return not _exited(pid, _state(pid))


def _group_alive(pgid: int) -> bool:
    """Whether process group ``pgid`` holds a process that is not a zombie (Linux /proc; elsewhere, any process)."""
    if not _exists(os.killpg, pgid):
        return False
    if not os.path.isdir("/proc"):
        return True
    for entry in os.listdir("/proc"):
        fields = _stat(entry) if entry.isdigit() else None
        if fields is not None and fields[2] == str(pgid) and not _exited(entry, fields[0]):
            return True
    return False


def _exited(pid: int | str, state: str | None) -> bool:
    """Whether a process whose state letter is ``state`` has let go of everything it held. A zombie's main thread
    may show "Z" while its other threads are still exiting, and they share its open files: a broker killed with
    -9 and taken for gone at its main thread's "Z" still accepted connections on its port for a moment (the
    console test's peer-down probe was answered, once in a full run). Gone means no thread left but the zombie."""
    if state not in ("Z", "X"):
        return False
    try:
        return len(os.listdir(f"/proc/{pid}/task")) <= 1
    except OSError:
        return True   # no /proc entry any more: reaped


def wait_frozen(pid: int, timeout_s: float) -> bool:
    """Until every thread of ``pid`` is stopped after a SIGSTOP (delivered asynchronously: a frozen raft follower
    still acknowledged an entry after ``kill`` returned), at most ``timeout_s``; a process gone meanwhile counts as
    frozen. False if a thread still ran at the end."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            states = [_state(f"{pid}/task/{tid}") for tid in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            return True
        if all(s in ("T", "t", "Z", "X", None) for s in states):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.0005)


def _state(pid: int | str) -> str | None:
    """The process's state letter from /proc (Linux), None where there is no /proc or no such process."""
    fields = _stat(pid)
    return fields[0] if fields else None


def _stat(pid: int | str) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state, ppid, pgrp, ...); None when unreadable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].decode().split() or None
    except (OSError, IndexError):
        return None


def restart_all(dir_: str, ready_timeout_s: float = READY_TIMEOUT_S) -> dict[str, Any]:
    """`dev up` on a DIR that already holds a stopped cluster starts every member again on its own data."""
    cluster = load(dir_)
    members = cluster["meta"] + cluster["brokers"]
    running = [_name(m) for m in members if _alive(m["pid"])]
    if running:
        raise AlreadyRunning(f"{dir_} holds a running cluster ({', '.join(running)}); `stator dev down --dir {dir_}` "
                             "first")
    started: list[dict[str, Any]] = []
    with _stopped_on_failure(lambda: started):
        for kind, argv in (("meta", _meta_argv), ("brokers", _broker_argv)):
            for m in cluster[kind]:
                m["pid"] = _spawn(dir_, _name(m), argv(m))
                started.append(m)
            save(dir_, cluster)
            _wait_members(dir_, cluster[kind], ready_timeout_s)
    return cluster


def start(dir_: str, name: str, wait: bool = True) -> dict[str, Any]:
    dir_ = os.path.abspath(dir_)
    cluster = load(dir_)
    for kind, argv in (("meta", _meta_argv), ("brokers", _broker_argv)):
        for m in cluster[kind]:
            if _name(m) == name:
                if _alive(m["pid"]):
                    raise AlreadyRunning(f"{name} is already running (pid {m['pid']})")
                m["pid"] = _spawn(dir_, name, argv(m))
                save(dir_, cluster)
                # A lone meta node is ready only once a majority is back: start it without waiting. A member that is
                # slow to get ready is left running (a bench measures how long it takes); one that exited is named.
                if wait:
                    _wait_members(dir_, [m])
                return m
    raise NoSuchMember(f"no member named {name!r} in {dir_}/cluster.json")


def stop_member(dir_: str, name: str, sig: int = signal.SIGTERM) -> None:
    cluster = load(dir_)
    for m in cluster["meta"] + cluster["brokers"]:
        if _name(m) == name:
            _signal_and_wait([m["pid"]], sig)
            return
    raise NoSuchMember(f"no member named {name!r} in {dir_}/cluster.json")


def _signal_and_wait(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
    if not _wait_gone(pids, STOP_TIMEOUT_S):
        for pid in pids:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        _wait_gone(pids, KILL_TIMEOUT_S)


def stop_process(proc: subprocess.Popen, timeout_s: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM to a child this process started (a bench's server, a test's lone broker), then kill -9 once it has
    not ended within ``timeout_s``; returns once it is gone."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(KILL_TIMEOUT_S)


def _wait_gone(pids: list[int], timeout_s: float) -> bool:
    """Until every member and every process of its group (a member leads its own, and its children are in it) is
    gone. The member alone was not enough: a meta node killed while it started its projection writer left the forked
    child, which held the node's sockets until it exec'd or died, and the member started again at once found its raft
    port in use (tests/test_raft_power_loss.py, once in a full run, with members started in a few ms by
    ops/forkserver.py)."""
    deadline = time.monotonic() + timeout_s
    while any(_alive(p) or _group_alive(p) for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(STOP_POLL_INTERVAL_S)
    return True


def down(dir_: str) -> None:
    dir_ = os.path.abspath(dir_)
    cluster = load(dir_)
    _signal_and_wait([m["pid"] for m in cluster["brokers"]], signal.SIGTERM)
    _signal_and_wait([m["pid"] for m in cluster["meta"]], signal.SIGTERM)
