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
import time

import aiohttp
import pytest

from meta import limits
from tests.support.raft_procs import leader, propose, raft_procs, status

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
    with raft_procs(tmp_path, TUNING) as cluster:
        yield cluster.urls


async def _propose(session: aiohttp.ClientSession, url: str, entry_bytes: int) -> tuple[dict, float]:
    return await propose(session, url, entry_bytes, ANSWER_S + 5.0)


@pytest.mark.long(seconds=27)   # its module alone, measured on 2 cores (tests/conftest.py)
async def test_every_entry_size_is_answered_and_the_log_keeps_going(nodes):
    async with aiohttp.ClientSession() as session:
        leading = await leader(session, nodes, WAIT_S)
        follower = next(u for u in nodes if u != leading)
        sem = asyncio.Semaphore(CONCURRENCY)
        answers: dict[int, tuple[dict, float]] = {}

        async def one(i: int, size: int) -> None:
            async with sem:
                answers[size] = await _propose(session, follower if i % 2 else leading, size)

        swept = sizes()
        await asyncio.gather(*(one(i, size) for i, size in enumerate(swept)))
        slow = {size: took for size, (_, took) in answers.items() if took > ANSWER_S}
        assert slow == {}, f"answered after more than {ANSWER_S} s: {list(slow.items())[:10]}"
        too_large = limits.COMMAND_BYTES_MAX + 4096   # past the command limit however it is stamped: refused
        assert answers.pop(too_large)[0]["code"] == "TOO_LARGE"
        failed = {size: a for size, (a, _) in answers.items() if not a["ok"]}
        assert all(a["code"] in REFUSALS for a in failed.values()), list(failed.items())[:10]
        assert len(failed) <= len(swept) // 100, f"{len(failed)} of {len(swept)} refused: {list(failed.items())[:10]}"

        leading = await leader(session, nodes, WAIT_S)
        answer, took = await _propose(session, leading, 200)
        assert answer["ok"] and took < SMALL_WRITE_S, (answer, took)
        # Every replica applies the same log: the same image at the same applied index.
        deadline = time.monotonic() + WAIT_S
        while True:
            statuses = [await status(session, u) for u in nodes]
            if all(statuses) and len({(s["applied"], s["digest"]) for s in statuses}) == 1:
                break
            assert time.monotonic() < deadline, statuses
            await asyncio.sleep(0.2)
        print(f"\n[entry sizes] {len(swept)} proposals, {len(failed)} refused; slow ticks per node "
              f"{[s['slow_ticks'] for s in statuses]}, role changes {[s['role_changes'] for s in statuses]}")
