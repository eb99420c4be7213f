"""Three real MetaSyncObj node processes (tests/support/raft_proc.py) on loopback, and what tests ask of them."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from ops import devcluster

SECRET = "raft-procs-test-secret"
STATUS_TIMEOUT_S = 2.0


@dataclass
class RaftProcs:
    urls: list[str]                 # each node's HTTP face
    procs: list[subprocess.Popen]   # in the same order


@contextlib.contextmanager
def raft_procs(tmp_path: Path, tuning: dict) -> Iterator[RaftProcs]:
    """Start three nodes (their output in ``tmp_path/n<i>.log``); kill them all at the end, stopped ones too."""
    base = devcluster.free_base_port()
    rafts = [f"127.0.0.1:{base + i}" for i in range(3)]
    https = [base + 3 + i for i in range(3)]
    procs = []
    try:
        for i, raft in enumerate(rafts):
            with open(tmp_path / f"n{i}.log", "wb") as log:
                peers = ",".join(r for r in rafts if r != raft)
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "tests.support.raft_proc", raft, peers, str(tmp_path / f"n{i}"), SECRET,
                     str(https[i]), json.dumps(tuning)], stdout=log, stderr=subprocess.STDOUT, cwd=os.getcwd()))
        yield RaftProcs([f"http://127.0.0.1:{port}" for port in https], procs)
    finally:
        for p in procs:
            p.kill()
            p.wait(10)
        for p in procs:
            assert p.returncode is not None


async def status(session: aiohttp.ClientSession, url: str) -> dict | None:
    try:
        async with session.get(url + "/status", timeout=aiohttp.ClientTimeout(total=STATUS_TIMEOUT_S)) as r:
            return await r.json()
    except (aiohttp.ClientError, OSError, asyncio.TimeoutError):
        return None


async def leader(session: aiohttp.ClientSession, urls: list[str], wait_s: float) -> str:
    """The leader's URL, once every node process answers: two nodes elect a leader while the third may still be
    importing, and a proposal sent to a follower that is not listening yet fails on connect, not on the log."""
    deadline = time.monotonic() + wait_s
    while True:
        statuses = [await status(session, url) for url in urls]
        leaders = [url for url, s in zip(urls, statuses) if s and s["leader"]]
        if all(statuses) and leaders:
            return leaders[0]
        assert time.monotonic() < deadline, f"no leader among answering node processes: {statuses}"
        await asyncio.sleep(0.1)


async def propose(session: aiohttp.ClientSession, url: str, entry_bytes: int,
                  timeout_s: float) -> tuple[dict, float]:
    """``POST /propose``: (the node's answer, seconds it took)."""
    started = time.monotonic()
    async with session.post(f"{url}/propose?entry_bytes={entry_bytes}",
                            timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
        return await r.json(), time.monotonic() - started
