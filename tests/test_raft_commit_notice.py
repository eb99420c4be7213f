"""The leader sends the commit index alone in a commit notice, which a follower that takes it does not answer.

Once an entry commits, the leader tells its followers at once (``shim.send_commit_notice``): an empty append marked
QUIET. pysyncobj's followers answered every append, so each write cost the leader two answers that told it
nothing (each follower's match index was already the last entry), each read in a tick of its own. A follower still
answers a notice it refuses (its log does not hold the leader's last entry): the leader must learn where to send
from. First a held follower of three in-process nodes is handed notices; then a live leader's received answers are
counted over sequential writes.
"""

from __future__ import annotations

import asyncio
import time

from meta.raft import pysyncobj_shim as shim
from meta.raft.group_commit import ACK_MESSAGE
from meta.raft.local_commit import LEADER_SYNCED
from meta.raft.node import RaftNode
from tests.support.raft_nodes import leader_of, start_nodes

SECRET = "commit-notice-test-secret"
WAIT_S = 20.0
SEQUENTIAL_WRITES = 60


async def test_a_commit_notice_taken_commits_and_is_not_answered(held_follower):
    f = held_follower
    last, term, commit, _ = f.uncommitted_tail()
    assert f.node.raftCommitIndex == commit < last + 2
    answers = f.answers_to(term, last + 2, [], last + 2, **{shim.QUIET: True})
    assert answers == [], "a commit notice the follower took was answered"
    assert f.node.raftCommitIndex == last + 2


async def test_the_same_append_not_marked_quiet_is_answered(held_follower):
    # The notice's one difference from pysyncobj's heartbeat: without the mark the answer still goes.
    f = held_follower
    last = f.last
    answers = f.answers_to(f.term, last, [], f.node.raftCommitIndex)
    assert len(answers) == 1 and answers[0]["success"] and answers[0]["next_node_idx"] == last + 1, answers


async def test_a_commit_notice_past_the_followers_log_is_refused_aloud(held_follower):
    f = held_follower
    last, commit = f.last, f.node.raftCommitIndex
    answers = f.answers_to(f.term, last + 3, [], last + 3, prev_term=f.term, **{shim.QUIET: True})
    assert len(answers) == 1 and not answers[0]["success"], answers
    assert f.node.raftCommitIndex == commit


async def test_a_commit_notice_of_another_term_at_the_last_entry_is_refused_aloud(held_follower):
    f = held_follower
    last, _, commit, _ = f.uncommitted_tail()
    answers = f.answers_to(f.term + 1, last + 2, [], last + 2, prev_term=f.term + 1, **{shim.QUIET: True})
    assert len(answers) == 1 and not answers[0]["success"], answers
    assert f.node.raftCommitIndex == commit, "committed entries the new leader's log does not hold"


async def test_an_append_with_entries_is_answered_even_marked_quiet(held_follower):
    f = held_follower
    last, term, commit = f.last, f.term, f.node.raftCommitIndex
    command = f.entry(last)[0]
    answers = f.answers_to(term, last, [(command, last + 1, term)], commit, **{shim.QUIET: True})
    assert len(answers) == 1 and answers[0]["success"] and answers[0]["next_node_idx"] == last + 2, answers


async def test_followers_answer_each_write_once_not_its_commit_too(tmp_path):
    nodes = start_nodes(tmp_path, SECRET)
    try:
        leader, raft = await leader_of(nodes, WAIT_S)
        transport = shim.transport(leader)
        receive, send = transport._onMessageReceivedCallback, transport.send
        # Per follower: answers of success that moved nothing (the leader held that match index already), and the
        # empty appends the leader sent it: heartbeats (answered) and commit notices (not)
        idle = {n.address: 0 for n in leader.otherNodes}
        moved = {n.address: 0 for n in leader.otherNodes}
        heartbeats = {n.address: 0 for n in leader.otherNodes}
        notices = {n.address: 0 for n in leader.otherNodes}
        marks = {n.address: 0 for n in leader.otherNodes}   # meta/raft/local_commit.py

        def sending(node, message):
            if message.get("type") == shim.APPEND and not message.get("entries") and node.address in notices:
                (notices if message.get(shim.QUIET) else heartbeats)[node.address] += 1
            elif message.get("type") == LEADER_SYNCED and node.address in marks:
                marks[node.address] += 1
            return send(node, message)

        def counting(node, message):
            if isinstance(message, dict) and message.get("type") == ACK_MESSAGE and message.get("success"):
                known = shim.match_indexes(leader).get(node.address, 0)
                if message["next_node_idx"] - 1 > known:
                    moved[node.address] += 1
                else:
                    idle[node.address] += 1
            receive(node, message)

        transport.setOnMessageReceivedCallback(counting)
        transport.send = sending
        for i in range(SEQUENTIAL_WRITES):
            r = await raft.propose({"type": "Barrier"}, f"seq-{i}", "system", timeout_s=WAIT_S)
            assert r["ok"], r
        # Let the last commit reach the followers (a notice answered by mistake would arrive now)
        deadline = time.monotonic() + WAIT_S
        while any(n.raftCommitIndex < leader.raftCommitIndex for n in nodes):
            assert time.monotonic() < deadline, "the followers did not learn the last commit"
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.02)
        transport.setOnMessageReceivedCallback(receive)
        transport.send = send
        # Each write's entry is answered by each follower (its match index moves); the leader's mark of its synced
        # journal, sent at once after, is not, and with three voters no commit notice goes (each follower commits
        # on the mark). A heartbeat (50 ms without a send) is still answered, and a loaded machine may stall between
        # writes long enough for many: the idle answers are bounded by the heartbeats sent (two more for answers to
        # heartbeats sent before the count began), not by a share of the writes.
        for address in idle:
            assert moved[address] >= SEQUENTIAL_WRITES // 2, (moved, idle)
            assert marks[address] >= SEQUENTIAL_WRITES // 2 and notices[address] == 0, (marks, notices)
            assert idle[address] <= heartbeats[address] + 2, \
                f"answers that told the leader nothing: {idle}, heartbeats sent {heartbeats}, notices {notices}"
    finally:
        for n in nodes:
            n.stop()


async def test_a_follower_behind_gets_entries_not_a_notice(tmp_path):
    nodes = start_nodes(tmp_path, SECRET)
    try:
        leader, raft = await leader_of(nodes, WAIT_S)
        r = await raft.propose({"type": "Barrier"}, "behind", "system", timeout_s=WAIT_S)
        assert r["ok"], r
        transport = shim.transport(leader)
        send = transport.send
        sent: list[tuple[str, dict]] = []

        def recording(node, message):
            sent.append((node.address, message))
            return send(node, message)

        transport.send = recording
        try:
            # No await from here to the end: no tick of the leader runs in between (the nodes tick on this loop)
            last = shim.current_log_index(leader)
            assert shim.send_commit_notice(leader) is True
            notices = [m for _, m in sent if m.get("type") == shim.APPEND]
            assert len(notices) == len(leader.otherNodes), sent
            assert all(m[shim.QUIET] is True and m["entries"] == [] and m["prevLogIdx"] == last
                       and m["commit_index"] == leader.raftCommitIndex for m in notices), notices
            sent.clear()
            behind = next(iter(leader.otherNodes))
            assert shim.set_next_index(leader, behind, last)
            assert shim.send_commit_notice(leader) is False
            assert sent == [], "a notice went while a follower needed entries"
        finally:
            transport.send = send
    finally:
        for n in nodes:
            n.stop()


async def test_a_forwarded_command_s_answer_shares_the_frame_of_its_entries(tmp_path):
    """A follower's proposal travels to the leader (apply_command); the leader's answer (its index and term) and the
    append that carries the entry leave in one frame to that follower, not two (MetaSyncObj._batch_appends: the
    transport's own tick flush, which runs first, is off)."""
    nodes = start_nodes(tmp_path, SECRET)
    try:
        leader, _ = await leader_of(nodes, WAIT_S)
        follower = next(n for n in nodes if n is not leader)
        follower.bridge.loop = asyncio.get_running_loop()
        raft = RaftNode(follower, asyncio.get_running_loop(), offset_budget=1000)
        transport = shim.transport(leader)
        send_frame = transport._send_messages
        frames: list[set[str]] = []   # the message types of each frame the leader sent the follower

        def framing(conn, messages):
            if conn.node is not None and conn.node.address == follower.selfNode.address:
                frames.append({m.get("type") for m in messages})
            return send_frame(conn, messages)

        transport._send_messages = framing
        try:
            for i in range(SEQUENTIAL_WRITES):
                r = await raft.propose({"type": "Barrier"}, f"fwd-{i}", "system", timeout_s=WAIT_S)
                assert r["ok"], r
        finally:
            transport._send_messages = send_frame
        answers = [f for f in frames if "apply_command_response" in f]
        assert len(answers) >= SEQUENTIAL_WRITES, frames
        assert all(shim.APPEND in f for f in answers), [sorted(f) for f in answers if shim.APPEND not in f]
    finally:
        for n in nodes:
            n.stop()
