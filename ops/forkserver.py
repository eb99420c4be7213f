"""Dev-cluster members started by forking one process that has imported the servers' code already.

A member started as ``python -m ops.cli meta serve ...`` spends ~0.5 s of CPU importing aiohttp, SQLAlchemy, click and
Stator before it does anything; the test suite starts about 1,200 of them, which on two cores was a third of its
time. Once ``enable()`` is called in a process (tests/conftest.py does; not inherited by the processes it starts, so
``stator dev up`` run as a command starts its members as ever), ``ops.devcluster`` asks this server instead: it
imports those modules once, then forks one child per member, which becomes exactly what the command line would have
started (its own session, its log as stdout and stderr, stdin from /dev/null, its working directory, the caller's
environment, a fresh random seed) and runs the same ``python -m`` module with the same arguments. The members are
real processes: their own pid, killed with SIGKILL, restarted, each with its own event loop and threads (none exists
in the server, so a fork copies none). One difference shows: a member's
/proc/PID/cmdline is the server's (``python -m ops.forkserver``); its working directory is its cluster's, as before.

The server reads one JSON request per line on stdin and answers the child's pid (or an error) on stdout; stdin's end
(its parent gone) ends it. Children are reaped by the kernel (SIGCHLD ignored here), so a killed member is gone at
once, as ``devcluster._alive`` expects.
"""

from __future__ import annotations

import importlib
import json
import os
import random
import runpy
import signal
import subprocess
import sys
import threading
from typing import Any

# What ``ops.cli``'s meta and broker serve commands import (most of it lazily, inside run_meta and run_broker)
PRELOAD = ("ops.cli", "meta.serve", "meta.api.app", "meta.config", "broker.serve", "broker.api.app", "broker.config",
           "runtime.logging", "runtime.serve", "runtime.config_file", "pysyncobj", "sqlalchemy")
START_TIMEOUT_S = 60.0      # the server's first answer (its imports) on a loaded machine
REQUEST_BYTES_MAX = 1 << 20


class ForkServerError(RuntimeError):
    pass


_enabled = False


def enable() -> None:
    global _enabled
    _enabled = True


def wanted() -> bool:
    return _enabled


def _child(request: dict[str, Any]) -> None:
    """In the forked child: become the member the command line describes, run it, never return."""
    code = 1
    try:
        os.setsid()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)   # the meta node waits for its projection writer
        log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(null)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        random.seed()   # forked children would otherwise draw the same election timeouts
        argv = request["argv"]
        if argv[1:2] != ["-m"]:
            raise ForkServerError(f"only 'python -m module ...' is started here, not {argv[:3]}")
        sys.argv = [argv[2], *argv[3:]]
        try:
            runpy.run_module(argv[2], run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if not isinstance(e.code, (int, type(None))):
                print(e.code, file=sys.stderr)
    except BaseException:
        import traceback
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def serve() -> None:
    for name in PRELOAD:
        importlib.import_module(name)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)   # children reaped by the kernel: no zombies
    out = sys.stdout
    out.write(json.dumps({"ready": os.getpid()}) + "\n")
    out.flush()
    for line in sys.stdin:
        try:
            request = json.loads(line)
        except ValueError as e:
            out.write(json.dumps({"error": f"bad request: {e}"}) + "\n")
            out.flush()
            continue
        out.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(request)
        out.write(json.dumps({"pid": pid}) + "\n")
        out.flush()


class Client:
    """One fork server per process that starts members (started at the first spawn), shared by its threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._owner = 0

    def spawn(self, argv: list[str], cwd: str, log: str) -> int:
        request = json.dumps({"argv": argv, "cwd": cwd, "log": log, "env": dict(os.environ)})
        if len(request) > REQUEST_BYTES_MAX:
            raise ForkServerError(f"a start request of {len(request)} bytes (at most {REQUEST_BYTES_MAX})")
        with self._lock:
            proc = self._server()
            proc.stdin.write(request + "\n")
            proc.stdin.flush()
            answer = self._answer(proc)
        if "pid" not in answer:
            raise ForkServerError(answer.get("error", f"unexpected answer {answer}"))
        return int(answer["pid"])

    def _server(self) -> subprocess.Popen:
        if self._proc is not None and self._proc.poll() is None and self._owner == os.getpid():
            return self._proc
        # stderr inherited: an import error shows in the caller's output
        self._proc = subprocess.Popen([sys.executable, "-m", "ops.forkserver"], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, text=True, bufsize=1)
        self._owner = os.getpid()
        self._answer(self._proc, START_TIMEOUT_S)
        return self._proc

    @staticmethod
    def _answer(proc: subprocess.Popen, timeout_s: float = START_TIMEOUT_S) -> dict[str, Any]:
        got: list[str] = []
        reader = threading.Thread(target=lambda: got.append(proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout_s)
        if not got or not got[0]:
            proc.kill()
            raise ForkServerError(f"the fork server (pid {proc.pid}) gave no answer within {timeout_s} s")
        return json.loads(got[0])


CLIENT = Client()


if __name__ == "__main__":
    serve()
