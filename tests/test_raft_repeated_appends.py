"""A follower keeps the entries an append message repeats (Raft, Figure 2, AppendEntries step 3).

pysyncobj's follower deleted every entry after prevLogIdx whenever its log went on past it, so a leader resending
from behind (a reject resets its next index; a resend carries at most one batch) took back entries the follower had
already acknowledged: a committed entry could lose its majority. ``shim.keep_matching_entries`` puts such messages
in Raft's terms.

First, three real nodes in this process (real pysyncobj, real TCP) replicate a few entries; then one follower's tick
thread is held and the test hands it, through its transport's own receive callback, the append messages a leader
sends when it resends from behind. Every check but the conflict's fails on pysyncobj's own handling; the
conflict's is Raft's own deletion, which must stay. An entry sent in pieces (pysyncobj's way for big entries, which
stalled the log for some sizes) is refused: no node of ours sends one. Last, real processes: writes while the leader is killed and
restarted, and no node may delete entries it has applied.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from meta.raft import pysyncobj_shim as shim
from tests.support import cluster as cluster_mod
from tests.support.meta_http import ok, write_configs_until
from tests.support.raft_nodes import leader_of, start_nodes
from tests.support.metrics import scrape

SECRET = "repeated-appends-test-secret"
WAIT_S = 20.0


async def test_a_repeated_entry_keeps_the_entries_after_it(held_follower):
    f = held_follower
    last, term, commit = f.last, f.term, f.node.raftCommitIndex
    kept = [f.entry(i) for i in range(last - 3, last + 1)]
    repeats = f.node.held_entries().repeats   # the live cluster may have resent before: count from here
    answer = f.append(term, last - 3, [f.entry(last - 2)], commit)
    assert f.last == last, "the repeat took back entries the follower had acknowledged"
    assert [f.entry(i) for i in range(last - 3, last + 1)] == kept
    # The answer acknowledges what the message showed to match, no more: the leader's match index only grows.
    assert answer["success"] and answer["next_node_idx"] == last - 1, answer
    assert f.node.raftCommitIndex == commit
    assert f.node.held_entries().repeats == repeats + 1


async def test_a_heartbeat_from_behind_keeps_the_log(held_follower):
    f = held_follower
    last = f.last
    answer = f.append(f.term, last - 3, [], f.node.raftCommitIndex)
    assert f.last == last
    assert answer["success"] and answer["next_node_idx"] == last - 2, answer


async def test_an_entry_in_pieces_is_refused_and_changes_nothing(held_follower):
    # No node of ours sends pieces (the append batch is above the largest entry, meta/raft/node.py); pysyncobj's
    # own handling of them stalled the log for some sizes, so a piece is dropped unanswered.
    f = held_follower
    last, refused = f.last, f.node.held_entries().pieces_refused
    kept = [f.entry(i) for i in range(last - 3, last + 1)]
    answers = f.append_in_pieces(f.term, last - 3, f.entry(last - 2), f.node.raftCommitIndex)
    assert answers == []
    assert f.last == last and [f.entry(i) for i in range(last - 3, last + 1)] == kept
    assert f.node.held_entries().pieces_refused == refused + 2


async def test_a_conflicting_entry_still_replaces_the_rest_from_there(held_follower):
    f = held_follower
    last, term, commit, command = f.uncommitted_tail()
    # Two entries this term's leader appended but did not commit, then a new leader whose log agrees on the first
    # and not the second: the first stays, the second goes.
    trimmed = f.node.held_entries().trimmed
    answer = f.append(term + 1, last, [(command, last + 1, term), (command, last + 2, term + 1)], commit)
    assert f.last == last + 2
    assert f.entry(last + 1)[2] == term and f.entry(last + 2)[2] == term + 1
    assert answer["success"] and answer["next_node_idx"] == last + 3, answer
    assert f.node.held_entries().trimmed == trimmed + 1


async def test_commit_stops_at_the_last_entry_the_message_showed_to_match(held_follower):
    f = held_follower
    last, term, _, _ = f.uncommitted_tail()
    # A new leader repeats entry `last` and has committed two more entries of its own. The follower's two
    # uncommitted entries need not be those: they stay (no conflict was shown) but may not be committed.
    answer = f.append(term + 1, last - 1, [f.entry(last)], last + 2)
    assert f.last == last + 2
    assert f.node.raftCommitIndex == last, "committed entries the new leader never showed to match"
    assert answer["success"] and answer["next_node_idx"] == last + 1, answer


async def test_a_snapshot_piece_commits_nothing_of_the_followers_own_tail(held_follower):
    # A leader cut off from its peers kept appending in its old term; the new leader, whose log went on without
    # those entries, sends it a snapshot. A piece of it shows nothing of the follower's log to match: pysyncobj
    # raised the commit index over the old tail and applied it, answering ok for a write no majority held (the
    # chaos runner's leader_cut fault found it: a compare-and-set acknowledged, then gone).
    f = held_follower
    last, term, commit, _ = f.uncommitted_tail()
    held = f.node.held_entries().snapshot_commits_held
    f.snapshot_piece(term + 1, commit=last + 10)
    assert f.node.raftCommitIndex == commit, "a snapshot piece committed the follower's own uncommitted entries"
    assert f.node.raftCurrentTerm == term + 1   # the rest of the message still counts: the new leader's term
    assert f.node.held_entries().snapshot_commits_held == held + 1


async def test_an_entry_bigger_than_one_message_reaches_both_followers(tmp_path):
    # pysyncobj's default batch (64 KB) sent such an entry in pieces; it now goes whole in one append message.
    nodes = start_nodes(tmp_path, SECRET)
    try:
        leader, raft = await leader_of(nodes, WAIT_S)
        await raft.propose({"type": "Barrier", "pad": "x" * 300_000}, "rid-big", "system", timeout_s=WAIT_S)
        index = shim.current_log_index(leader)
        big = shim.log_entry(leader, index)
        assert len(big[0]) > 300_000
        deadline = time.monotonic() + WAIT_S
        while any(n.raftCommitIndex < index for n in nodes):
            assert time.monotonic() < deadline, "the big entry did not reach every node"
            await asyncio.sleep(0.05)
        assert all(shim.log_entry(n, index) == big for n in nodes)
    finally:
        for n in nodes:
            n.stop()


# -- real processes -------------------------------------------------------------------------------------------
TRUNCATED_APPLIED = "truncating already-applied log entries"   # pysyncobj's own critical log line
KILLS = 3
WRITERS = 16


@pytest.mark.long(seconds=25)   # its module alone, measured on 2 cores (tests/conftest.py)
async def test_followers_never_take_back_applied_entries_while_leaders_are_killed(tmp_path):
    # Writes through every node while the leader is killed (-9) and restarted: the restarted node rejects appends
    # it cannot place, each reject resets the leader's next index, and the leader resends from behind. Measured on
    # the code before the guard: pysyncobj logged its "truncating already-applied log entries" 158 times in one
    # such run (4 kills), on every node; with the guard, never, and the held-entries counters show the resends.
    async with cluster_mod.running(str(tmp_path), 3, 0) as c:
        await ok(c, "PUT", "/v1/brokers/b1", role="broker", json={"address": "http://127.0.0.1:1"})
        await ok(c, "POST", "/v1/topics", json={"topic": "t", "queues": 1, "brokers": ["b1"]}, expect=(201,))
        acked: dict[int, tuple[str, str]] = {}
        stop = asyncio.Event()
        # 1 KB values: entries big enough that a resend stops at its 64 KB batch, short of the follower's log
        writing = asyncio.create_task(write_configs_until(c, "t", WRITERS, stop, acked, pad=1000))
        try:
            for _ in range(KILLS):
                await asyncio.sleep(2.0)
                leader = await c.leader(30.0)
                await asyncio.to_thread(c.kill9, leader)
                await asyncio.sleep(1.0)
                await asyncio.to_thread(c.start, leader)
            await asyncio.sleep(2.0)
        finally:
            stop.set()
            await writing   # a writer's exception fails the test here
        assert acked
        held = 0
        for m in c.info["meta"]:
            samples = await scrape(c.session, m["url"])
            held += sum(v for _, v in samples["stator_meta_raft_held_entries_appends_total"])
        logs = {p.name: p.read_text(errors="replace").count(TRUNCATED_APPLIED)
                for p in (tmp_path / "cluster" / "logs").glob("*.log")}
        print(f"\n[repeated appends] {len(acked)} writes acknowledged, {held} appends repeated held entries, "
              f"pysyncobj truncations of applied entries per log: {logs}")
        assert held > 0, "no leader resent from behind: the run did not exercise the guard"
        assert not any(logs.values()), logs
