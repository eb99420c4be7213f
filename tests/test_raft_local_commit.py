"""A follower commits on the leader's mark what it holds on disk itself, with three voters (meta/raft/local_commit.py).

First the rule alone (``committable``), then a held follower of three in-process nodes handed marks, then three live
in-process nodes whose followers' acknowledgements are dropped: a write a follower answered on its own is in every
linearizable read on the leader after it, though the leader has not counted it yet.
"""

from __future__ import annotations

import asyncio
import dataclasses

from meta.raft import pysyncobj_shim as shim
from meta.raft.group_commit import ACK_MESSAGE
from meta.raft.local_commit import LEADER_SYNCED, caught_up, committable
from meta.raft.node import RaftNode, RaftTuning
from tests.support.raft_nodes import all_applied, leader_of, start_nodes

SECRET = "local-commit-test-secret"
WAIT_S = 20.0
HELD_S = 0.3     # acknowledgements dropped this long, far under the leader's step-down of SLOW_RAFT
# The leader steps down when no follower answered for leader_fallback_timeout_s: ten times the hold, so a loaded
# machine's stalls do not end the test's leadership while the answers are dropped.
SLOW_RAFT = dataclasses.replace(RaftTuning(), election_timeout_min_s=3.0, election_timeout_max_s=6.0,
                                leader_fallback_timeout_s=3.0, connection_timeout_s=6.0)


# -- the rule --------------------------------------------------------------------------------------------------
def test_three_voters_commit_up_to_the_lesser_of_mark_and_disk():
    terms = {5: 3, 6: 3, 7: 3, 8: 3}.get
    assert committable(mark=8, durable=6, commit=4, term_at=terms, term=3, voters=3) == 6
    assert committable(mark=6, durable=8, commit=4, term_at=terms, term=3, voters=3) == 6
    assert committable(mark=8, durable=8, commit=4, term_at=terms, term=3, voters=2) == 8


def test_nothing_is_committed_on_a_mark_with_four_voters_or_more():
    # The leader and this node are no majority of four: the commit notices do it.
    terms = {8: 3}.get
    assert committable(mark=8, durable=8, commit=4, term_at=terms, term=3, voters=4) is None
    assert committable(mark=8, durable=8, commit=4, term_at=terms, term=3, voters=5) is None


def test_an_entry_of_an_earlier_term_is_not_committed_by_counting():
    # Raft's rule (thesis 3.6.2): only an entry of the current term commits by where it is held.
    assert committable(mark=8, durable=8, commit=4, term_at={8: 2}.get, term=3, voters=3) is None
    assert committable(mark=8, durable=8, commit=4, term_at={}.get, term=3, voters=3) is None


def test_nothing_below_the_commit_index_moves_it():
    terms = {4: 3, 5: 3}.get
    assert committable(mark=5, durable=4, commit=4, term_at=terms, term=3, voters=3) is None
    assert committable(mark=5, durable=5, commit=5, term_at=terms, term=3, voters=3) is None


# -- a held follower ---------------------------------------------------------------------------------------------
def _mark(f, term: int, index: int, sender=None) -> None:
    f._receive(sender or f.leader, {"type": LEADER_SYNCED, "term": term, "index": index})


async def test_a_follower_commits_on_the_mark_only_what_its_own_disk_holds(held_follower):
    f = held_follower
    before = f.node.journal_stats()["local_commits"]   # the writes that caught it up committed here too
    last, term, commit, _ = f.uncommitted_tail()   # acknowledged (queued), not synced: the transport has not flushed
    _mark(f, term, last + 2)
    assert f.node.raftCommitIndex == commit, "committed entries its own disk did not hold yet"
    f.node._local.journal.sync()                 # as the tick syncs before the acknowledgement leaves
    f.node._local.local_commit.advance()         # and then looks again
    assert f.node.raftCommitIndex == last + 2
    assert f.node.journal_stats()["local_commits"] == before + 1


async def test_a_follower_commits_no_further_than_its_own_log(held_follower):
    f = held_follower
    last, term, commit, _ = f.uncommitted_tail()
    f.node._local.journal.sync()
    _mark(f, term, last + 5)                     # the leader holds more than it sent this follower
    assert f.node.raftCommitIndex == last + 2


async def test_a_mark_of_another_term_or_from_another_node_is_ignored(held_follower):
    f = held_follower
    last, term, commit, _ = f.uncommitted_tail()
    f.node._local.journal.sync()
    _mark(f, term + 1, last + 2)
    _mark(f, term - 1, last + 2)
    other = next(n for n in shim.voters(f.node) if n != f.leader)
    _mark(f, term, last + 2, sender=other)
    f.node._local.local_commit.advance()
    assert f.node.raftCommitIndex == commit, "a mark not from this term's leader moved the commit index"
    _mark(f, term, last + 2)
    assert f.node.raftCommitIndex == last + 2


# -- live nodes ----------------------------------------------------------------------------------------------------
async def test_a_write_a_follower_answered_on_its_own_is_in_the_leaders_next_linearizable_read(tmp_path):
    nodes = start_nodes(tmp_path, SECRET, tuning=SLOW_RAFT)
    try:
        leader, leader_raft = await leader_of(nodes, WAIT_S)
        entry = next(n for n in nodes if n is not leader)
        entry.bridge.loop = asyncio.get_running_loop()
        entry_raft = RaftNode(entry, entry.bridge.loop, offset_budget=1000)
        r = await leader_raft.propose({"type": "Barrier"}, "warm", "system", timeout_s=WAIT_S)
        assert r["ok"], r
        await all_applied(nodes, leader, WAIT_S)   # every node knows its leader and holds the log
        dropping = True
        for follower in (n for n in nodes if n is not leader):
            # Acknowledgements to the leader are lost on the way (after the sync they wait for): it cannot count
            # the next entry, its followers can
            transport = shim.transport(follower)

            def send_messages(conn, messages, send=transport._send_messages):
                if dropping:
                    messages = [m for m in messages if m.get("type") != ACK_MESSAGE]
                if messages:
                    send(conn, messages)

            transport._send_messages = send_messages
        r = await entry_raft.propose({"type": "Barrier"}, "answered-by-a-follower", "system", timeout_s=WAIT_S)
        assert r["ok"], r
        written = entry.applied_index
        assert leader.raftCommitIndex < written, "the leader counted the write: the scenario did not happen"
        assert entry.journal_stats()["local_commits"] > 0
        read = asyncio.create_task(leader_raft.read_index(WAIT_S))
        applied = asyncio.create_task(leader_raft.applied_commit(WAIT_S))
        await asyncio.sleep(HELD_S)
        # Answered now, either would serve an image without the write a client was told is done
        assert not read.done() and not applied.done(), \
            f"the leader answered at {leader.applied_index} before it held the write at {written}"
        dropping = False
        await read
        assert await applied
        assert leader.applied_index >= written
        assert leader.is_leader(), "the leader stepped down while its acknowledgements were dropped"
    finally:
        for n in nodes:
            n.stop()


def test_a_follower_that_applied_past_the_leaders_commit_it_heard_of_is_ready():
    # pysyncobj's readiness wants the last applied index equal to the leader's commit index last heard of; under a
    # steady write load a follower committing on marks is past it at most ticks (a restarted node stayed unready).
    assert caught_up(False, applied=10, heard=9)
    assert caught_up(False, applied=10, heard=10)
    assert not caught_up(False, applied=9, heard=10), "ready before it applied what the leader had committed"
    assert not caught_up(False, applied=9, heard=None), "ready before it heard of any leader"
    assert caught_up(True, applied=0, heard=None)
