"""A proposal in flight when its leader steps down is answered at the step-down, not at its timeout.

pysyncobj answered an appended proposal only once the log reached its index again; a leader cut off from both
followers steps down after ``leader_fallback_timeout_s`` and, with nothing written after, its proposer waited the
whole propose timeout for UNKNOWN_OUTCOME (CI: a 2 MiB entry appended just before a step-down at the end of the
entry-size sweep). Three real MetaSyncObj processes (tests/support/raft_procs.py); the followers are frozen with
SIGSTOP, so the leader appends but never commits.
"""

from __future__ import annotations

import os
import signal

import aiohttp

from ops import devcluster
from tests.support.raft_procs import leader, propose, raft_procs
from tests.support.raft_proc import PROPOSE_TIMEOUT_S

WAIT_S = 30.0
# The leader steps down after 0.5 s without a majority (RaftTuning.leader_fallback_timeout_s); the answer must come
# well before the node's own timeout gives up on the proposal.
ANSWERED_BY_S = PROPOSE_TIMEOUT_S - 1.5
ENTRY_BYTES = 300
FROZEN_WAIT_S = 5.0


async def test_a_leader_that_steps_down_answers_its_appended_proposals_leader_changed(tmp_path):
    with raft_procs(tmp_path, {}) as cluster:
        async with aiohttp.ClientSession() as session:
            leading = await leader(session, cluster.urls, WAIT_S)
            answer, _ = await propose(session, leading, ENTRY_BYTES, PROPOSE_TIMEOUT_S + 5.0)
            assert answer["ok"], answer   # the log works before the followers are frozen
            followers = [p for url, p in zip(cluster.urls, cluster.procs) if url != leading]
            try:
                for p in followers:
                    os.kill(p.pid, signal.SIGSTOP)
                    assert devcluster.wait_frozen(p.pid, FROZEN_WAIT_S), f"process {p.pid} still runs"
                answer, took = await propose(session, leading, ENTRY_BYTES, PROPOSE_TIMEOUT_S + 5.0)
            finally:
                for p in followers:
                    os.kill(p.pid, signal.SIGCONT)
            assert answer == {"ok": False, "code": "LEADER_CHANGED", "details": {"request_id": None}}, answer
            assert took < ANSWERED_BY_S, f"answered after {took:.2f} s"
