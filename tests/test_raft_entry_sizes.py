"""Every size of log entry the log accepts is replicated and answered; none stops the log.

pysyncobj sends an entry of at least ``appendEntriesBatchSizeBytes`` (64 KiB by default) in pieces and, for pickled
sizes just under a multiple of 64 KiB, marked two pieces 'finish': the entry was never appended, the leader resent
the same pieces forever and every later write answered UNKNOWN_OUTCOME. The sweep goes one byte at a time through
+-64 bytes around every 64 KiB multiple up to 1 MiB, then a few sizes up to the 8 MiB command limit, through three
real MetaSyncObj processes (tests/support/raft_proc.py: real pysyncobj, Stator's journal and transport, TCP on loopback),
half of it proposed through a follower (forwarded to the leader and stamped there). Every proposal must be answered
within 5 s, a small write after the sweep must commit within 1 s, and the replicas must end on the same image.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

import aiohttp
import pytest

from meta import limits
from ops import devcluster

SECRET = "entry-sizes-test-secret"
STEP_BYTES = 64 * 1024
WINDOW_BYTES = 64
ANSWER_S = 5.0
SMALL_WRITE_S = 1.0
CONCURRENCY = 8
WAIT_S = 30.0
# Compact often: the sweep moves over a gigabyte through each node, which must not stay in the journals' memory.
TUNING = {"compaction_min_entries": 300, "compaction_min_time_s": 2}
# An answer that is not a success must still be an answer, in time, naming why (an election under load).
REFUSALS = {"LEADER_CHANGED", "NO_LEADER"}


def sizes() -> list[int]:
    swept = [m * STEP_BYTES + d for m in range(1, 17) for d in range(-WINDOW_BYTES, WINDOW_BYTES + 1)]
    big = [2 * 1024 * 1024 + 7, 4 * 1024 * 1024 - 1, limits.COMMAND_BYTES_MAX, limits.COMMAND_BYTES_MAX + 4096]
    return swept + big


@pytest.fixture
def nodes(tmp_path):
    base = devcluster.free_base_port()
    rafts = [f"127.0.0.1:{base + i}" for i in range(3)]
    https = [base + 3 + i for i in range(3)]
    procs = []
    for i, raft in enumerate(rafts):
        log = open(tmp_path / f"n{i}.log", "wb")
        peers = ",".join(r for r in rafts if r != raft)
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "tests.support.raft_proc", raft, peers, str(tmp_path / f"n{i}"), SECRET, str(https[i]),
             json.dumps(TUNING)], stdout=log, stderr=subprocess.STDOUT, cwd=os.getcwd()))
        log.close()
    try:
        yield [f"http://127.0.0.1:{port}" for port in https]
    finally:
        for p in procs:
            p.kill()
            p.wait(10)
        for p in procs:
            assert p.returncode is not None


async def _status(session: aiohttp.ClientSession, url: str) -> dict | None:
    try:
        async with session.get(url + "/status", timeout=aiohttp.ClientTimeout(total=2.0)) as r:
            return await r.json()
    except (aiohttp.ClientError, OSError, asyncio.TimeoutError):
        return None


async def _leader(session: aiohttp.ClientSession, urls: list[str]) -> str:
    """The leader's URL, once every node process answers: two nodes elect a leader while the third may still be
    importing, and a sweep sent to a follower that is not listening yet fails on connect, not on the log."""
    deadline = time.monotonic() + WAIT_S
    while True:
        statuses = [await _status(session, url) for url in urls]
        leaders = [url for url, s in zip(urls, statuses) if s and s["leader"]]
        if all(statuses) and leaders:
            return leaders[0]
        assert time.monotonic() < deadline, f"no leader among answering node processes: {statuses}"
        await asyncio.sleep(0.1)


async def _propose(session: aiohttp.ClientSession, url: str, entry_bytes: int) -> tuple[dict, float]:
    started = time.monotonic()
    async with session.post(f"{url}/propose?entry_bytes={entry_bytes}",
                            timeout=aiohttp.ClientTimeout(total=ANSWER_S + 5.0)) as r:
        return await r.json(), time.monotonic() - started


@pytest.mark.long(seconds=27)   # its module alone, measured on 2 cores (tests/conftest.py)
async def test_every_entry_size_is_answered_and_the_log_keeps_going(nodes):
    async with aiohttp.ClientSession() as session:
        leader = await _leader(session, nodes)
        follower = next(u for u in nodes if u != leader)
        sem = asyncio.Semaphore(CONCURRENCY)
        answers: dict[int, tuple[dict, float]] = {}

        async def one(i: int, size: int) -> None:
            async with sem:
                answers[size] = await _propose(session, follower if i % 2 else leader, size)

        swept = sizes()
        await asyncio.gather(*(one(i, size) for i, size in enumerate(swept)))
        slow = {size: took for size, (_, took) in answers.items() if took > ANSWER_S}
        assert slow == {}, f"answered after more than {ANSWER_S} s: {list(slow.items())[:10]}"
        too_large = limits.COMMAND_BYTES_MAX + 4096   # past the command limit however it is stamped: refused
        assert answers.pop(too_large)[0]["code"] == "TOO_LARGE"
        failed = {size: a for size, (a, _) in answers.items() if not a["ok"]}
        assert all(a["code"] in REFUSALS for a in failed.values()), list(failed.items())[:10]
        assert len(failed) <= len(swept) // 100, f"{len(failed)} of {len(swept)} refused: {list(failed.items())[:10]}"

        leader = await _leader(session, nodes)
        answer, took = await _propose(session, leader, 200)
        assert answer["ok"] and took < SMALL_WRITE_S, (answer, took)
        # Every replica applies the same log: the same image at the same applied index.
        deadline = time.monotonic() + WAIT_S
        while True:
            statuses = [await _status(session, u) for u in nodes]
            if all(statuses) and len({(s["applied"], s["digest"]) for s in statuses}) == 1:
                break
            assert time.monotonic() < deadline, statuses
            await asyncio.sleep(0.2)
        print(f"\n[entry sizes] {len(swept)} proposals, {len(failed)} refused; slow ticks per node "
              f"{[s['slow_ticks'] for s in statuses]}, role changes {[s['role_changes'] for s in statuses]}")
