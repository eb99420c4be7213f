"""Proposals that wait for the same tick share one log entry, and each is still decided and answered on its own
(meta/raft/entry.py, meta/raft/proposals.py)."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
from pysyncobj import FAIL_REASON

from meta.raft import pysyncobj_shim as shim
from meta.raft.applier import DISCARDED, Pending
from meta.raft.entry import (ENVELOPE_BYTES_MAX, PROPOSALS_PER_ENTRY_MAX, STAMP_BYTES_MAX, compact, decode_entry,
                             encode_entry, encode_envelope, encode_stamp, restamped)
from meta.raft.journal import read_journal
from meta.raft.node import MetaSyncObj, RaftNode, RaftTuning
from ops import devcluster
from meta.raft.proposals import Proposals, batch_callback
from tests.support.raft_counter_cluster import wait_until
from tests.support.raft_nodes import LoopThread, all_applied, leader_of, settled_leader, start_node, start_nodes

STAMP = {"ts": 1_700_000_000_000, "budget": 1000, "history": 100_000}
WAIT_S = 20.0


def envelope(i: int) -> bytes:
    return encode_envelope({"rid": f"r{i}", "ts": 0, "budget": 1000, "actor": "system", "cmd": {"type": "Barrier"}})


# -- the format ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("note", ["plain ascii", "é😀", "\ud800", 2**70, float("nan"), float("inf"), None])
def test_an_envelope_orjson_would_write_otherwise_is_written_as_the_stdlib_writes_it(note):
    # meta/raft/entry.py writes an envelope through orjson only when its text is ASCII and holds no null: text out of
    # ASCII is escaped, a lone surrogate and a 70-bit integer (orjson refuses them) and a non-finite float (orjson
    # writes null, the stdlib NaN / Infinity, which apply refuses) are written by the stdlib encoder, as before.
    env = {"rid": "r", "ts": 0, "budget": 1000, "actor": "system", "cmd": {"type": "Barrier", "note": note}}
    assert encode_envelope(env) == compact(env).encode()


def test_an_entry_holds_its_envelopes_in_order_each_under_the_stamp():
    payload = encode_entry(encode_stamp(STAMP), [envelope(i) for i in range(3)])
    decoded = decode_entry(payload)
    assert [e["rid"] for e in decoded] == ["r0", "r1", "r2"]
    assert all(e["ts"] == STAMP["ts"] and e["history"] == STAMP["history"] for e in decoded)


def test_a_bad_envelope_spoils_only_itself_and_a_bad_stamp_spoils_its_entry():
    good, bad = envelope(1), b'{"rid": unquoted}'
    assert [e is None for e in decode_entry(encode_entry(encode_stamp(STAMP), [good, bad, good]))] == \
        [False, True, False]
    assert [e is None for e in decode_entry(b'[1,2]' + b"\n" + good + b"\n" + good)] == [True, True]
    assert decode_entry(encode_entry(encode_stamp({"ts": 1, "evil": 2}), [good])) == [None]   # unknown stamp field
    assert decode_entry(good) == [None]            # no stamp line at all
    assert decode_entry(b"\xff" * 10) == [None]
    assert decode_entry(12) == [None]


def test_restamping_replaces_the_stamp_line_and_keeps_every_envelope():
    payload = encode_entry(encode_stamp({}), [envelope(1), envelope(2)])
    stamped = decode_entry(restamped(payload, encode_stamp(STAMP)))
    assert [e["rid"] for e in stamped] == ["r1", "r2"] and all(e["ts"] == STAMP["ts"] for e in stamped)
    assert restamped(b"no stamp line", encode_stamp(STAMP)) is None


# -- the batcher ---------------------------------------------------------------------------------------------------
def test_take_packs_in_order_within_the_entry_bounds():
    p = Proposals(count_max=10_000)
    big = b"x" * (ENVELOPE_BYTES_MAX // 3)
    for e in (big, big, big, b"a", b"b"):
        assert p.add(e, lambda outcome, err: None)
    batches = p.take()
    assert [b.envelopes for b in batches] == [[big, big], [big, b"a", b"b"]]
    for b in batches:
        assert len(encode_entry(b"s" * STAMP_BYTES_MAX, b.envelopes)) <= ENVELOPE_BYTES_MAX
    assert p.take() == [] and len(p) == 0

    for i in range(PROPOSALS_PER_ENTRY_MAX + 1):
        p.add(b"%d" % i, lambda outcome, err: None)
    assert [len(b.envelopes) for b in p.take()] == [PROPOSALS_PER_ENTRY_MAX, 1]


def test_a_full_queue_refuses():
    p = Proposals(count_max=2)
    assert p.add(b"1", print) and p.add(b"2", print)
    assert not p.add(b"3", print)
    assert len(p.take()[0].envelopes) == 2 and p.add(b"3", print)


def test_each_proposal_gets_its_own_outcome_or_the_entrys_failure():
    lock = threading.Lock()
    got: list[tuple] = []
    callbacks = [lambda o, e, i=i: got.append((i, o, e)) for i in range(3)]

    pending = Pending(7)
    batch_callback(callbacks, lock)(pending, FAIL_REASON.SUCCESS)
    assert got == []                                   # not applied yet
    pending._resolve(["a", "b", "c"], lock)
    assert got == [(0, "a", FAIL_REASON.SUCCESS), (1, "b", FAIL_REASON.SUCCESS), (2, "c", FAIL_REASON.SUCCESS)]

    got.clear()
    pending = Pending(8)
    batch_callback(callbacks, lock)(pending, FAIL_REASON.SUCCESS)
    pending._resolve(DISCARDED, lock)                  # a snapshot install covered the entry: outcome unknown
    assert [o for _, o, _ in got] == [DISCARDED] * 3

    got.clear()
    batch_callback(callbacks, lock)(None, FAIL_REASON.LEADER_CHANGED)
    assert got == [(i, None, FAIL_REASON.LEADER_CHANGED) for i in range(3)]


# -- on real nodes -------------------------------------------------------------------------------------------------
async def _leader_and_follower(nodes: list) -> tuple:
    """(leader, its RaftNode, a follower, the follower's RaftNode) of nodes on this test's loop."""
    leader, on_leader = await leader_of(nodes, WAIT_S)
    follower = next(n for n in nodes if n is not leader)
    follower.bridge.loop = asyncio.get_running_loop()
    return leader, on_leader, follower, RaftNode(follower, follower.bridge.loop, offset_budget=1000)


async def _packed_burst(raft: RaftNode, leader, proposals: int = 100) -> int:
    """The entries ``proposals`` proposed at once through ``raft`` took, each answered ok: fewer than a quarter as
    many (one entry each had they been sent as they came)."""
    before = leader.raftCommitIndex
    outcomes = await asyncio.gather(*(raft.propose({"type": "Barrier"}, f"burst-{i}", "system", timeout_s=WAIT_S)
                                      for i in range(proposals)))
    assert all(o["ok"] for o in outcomes), outcomes
    entries = leader.raftCommitIndex - before
    assert entries < proposals / 4, f"{proposals} proposals in {entries} entries"
    return entries


async def test_concurrent_proposals_share_entries_and_are_decided_one_by_one(tmp_path):
    nodes = start_nodes(tmp_path, "batches-test-secret")
    try:
        leader, on_leader, _, on_follower = await _leader_and_follower(nodes)
        before = leader.raftCommitIndex
        proposals = 120

        async def one(i: int) -> dict:
            # Every third command is one the state machine refuses: its neighbours in the entry must not notice.
            cmd = {"type": "NoSuchCommand"} if i % 3 == 1 else {"type": "Barrier"}
            raft = on_follower if i % 2 else on_leader
            return await raft.propose(cmd, f"rid-{i}", "system", timeout_s=WAIT_S)

        outcomes = await asyncio.gather(*(one(i) for i in range(proposals)))
        assert [o["ok"] for o in outcomes] == [i % 3 != 1 for i in range(proposals)], outcomes
        assert all(o["error"]["status"] == 400 for i, o in enumerate(outcomes) if i % 3 == 1)
        entries = leader.raftCommitIndex - before
        assert 0 < entries < proposals / 2, f"{proposals} proposals in {entries} entries"
        await all_applied(nodes, leader, WAIT_S)
    finally:
        for n in nodes:
            n.stop()
    # In the journal: entries of several envelopes, every one stamped by the leader (the follower's too).
    for i in range(3):
        regular = [c for c, _i, _t in read_journal(str(tmp_path / f"n{i}")).entries
                   if shim.envelope_bytes(c) is not None]   # not the no-ops, nor the bootstrap membership
        envelopes = [e for c in regular for e in decode_entry(shim.envelope_bytes(c))]
        assert sorted(e["rid"] for e in envelopes) == sorted(f"rid-{k}" for k in range(proposals))
        assert max(len(c.split(b"\n")) - 1 for c in regular) > 1
        assert all(e["ts"] > 0 for e in envelopes), "an entry reached the log without the leader's stamp"
        assert all(json.loads(c[1:].split(b"\n")[0]).keys() == {"ts", "budget", "history"} for c in regular)


# -- coalescing under load (RaftTuning.propose_coalesce_s / _min) ---------------------------------------------------
COALESCE_S = 0.3   # long enough that a deferred wake shows in a proposal's time, short of any timeout here


async def test_a_lone_writer_never_waits_to_coalesce_and_a_loaded_node_does(tmp_path):
    tuning = RaftTuning(propose_coalesce_s=COALESCE_S, propose_coalesce_min=2)
    nodes = start_nodes(tmp_path, "coalesce-test-secret", tuning=tuning)
    try:
        leader, raft = await leader_of(nodes, WAIT_S)
        # One at a time: every entry of the leader's own carries one proposal, under the minimum of two.
        for i in range(20):
            outcome = await raft.propose({"type": "Barrier"}, f"lone-{i}", "system", timeout_s=WAIT_S)
            assert outcome["ok"], outcome
        assert leader.proposal_wakes_deferred == 0
        # Twenty at once, twice: the first round's entry carries several, so a proposal of the second may wait for
        # others (up to COALESCE_S: a tick that runs meanwhile takes them at once). Every one is still answered.
        for round_ in range(2):
            outcomes = await asyncio.gather(*(raft.propose({"type": "Barrier"}, f"load-{round_}-{i}", "system",
                                                           timeout_s=WAIT_S) for i in range(20)))
            assert all(o["ok"] for o in outcomes), outcomes
        assert leader.proposal_wakes_deferred >= 1
        # And alone again: the next entry of the leader's own carries one, so the one after never waits.
        deferred = leader.proposal_wakes_deferred
        for i in range(2):
            assert (await raft.propose({"type": "Barrier"}, f"after-{i}", "system", timeout_s=WAIT_S))["ok"]
        assert leader.proposal_wakes_deferred <= deferred + 1
    finally:
        for n in nodes:
            n.stop()


def test_coalescing_is_off_at_zero_and_bounded_in_the_config():
    from meta.config import RAFT_PROPOSE_COALESCE_S_MAX, _RaftTuningSchema
    assert _RaftTuningSchema(propose_coalesce_s=0).propose_coalesce_s == 0
    for bad in ({"propose_coalesce_s": RAFT_PROPOSE_COALESCE_S_MAX * 2}, {"propose_coalesce_s": -0.001},
                {"propose_coalesce_min": 0}):
        with pytest.raises(ValueError):
            _RaftTuningSchema(**bad)


async def test_a_loaded_leader_keeps_its_ticks_order_for_a_follower_s_forwarded_proposals(tmp_path):
    # Under load the leader's own proposals wait up to propose_coalesce_s to share an entry; a follower's forwarded
    # proposal read meanwhile must not be appended at once, or it would take them early (at 64 writers: 1-3% more
    # CPU a write, two syncs and marks a tick). It joins them in the tick instead.
    tuning = RaftTuning(propose_coalesce_s=COALESCE_S, propose_coalesce_min=2)
    nodes = start_nodes(tmp_path, "loaded-append-test-secret", tuning=tuning)
    try:
        leader, on_leader, _, on_follower = await _leader_and_follower(nodes)
        first = await asyncio.gather(*(on_leader.propose({"type": "Barrier"}, f"first-{i}", "system",
                                                         timeout_s=WAIT_S) for i in range(10)))
        assert all(o["ok"] for o in first), first   # the first went at once, the other nine shared an entry
        appended, deferred = leader.entries_appended_at_once, leader.proposal_wakes_deferred
        waiting = [asyncio.ensure_future(on_leader.propose({"type": "Barrier"}, f"waiting-{i}", "system",
                                                           timeout_s=WAIT_S)) for i in range(10)]
        await asyncio.sleep(0)   # queued, waiting to coalesce
        assert leader.proposal_wakes_deferred == deferred + 1
        assert (await on_follower.propose({"type": "Barrier"}, "forwarded", "system", timeout_s=WAIT_S))["ok"]
        assert all(o["ok"] for o in await asyncio.gather(*waiting))
        assert leader.entries_appended_at_once == appended
        await all_applied(nodes, leader, WAIT_S)
    finally:
        for n in nodes:
            n.stop()


# -- a follower's lone proposal leaves at once (MetaSyncObj._send_at_once) ---------------------------------------
async def test_a_follower_forwards_a_lone_proposal_at_once_and_packs_proposals_that_come_while_one_is_in_flight(
        tmp_path):
    # Coalescing off: what packs a follower's proposals into an entry here is only that one of its entries is in
    # flight. Sent at once as they came, the burst below would have made an entry each.
    nodes = start_nodes(tmp_path, "forward-test-secret", tuning=RaftTuning(propose_coalesce_s=0))
    try:
        leader, _, follower, on_follower = await _leader_and_follower(nodes)
        for i in range(20):
            assert (await on_follower.propose({"type": "Barrier"}, f"lone-{i}", "system", timeout_s=WAIT_S))["ok"]
        assert follower.proposals_forwarded_at_once == 20   # nothing of its own in flight each time
        at_once = follower.proposals_forwarded_at_once
        entries = await _packed_burst(on_follower, leader)
        assert follower.proposals_forwarded_at_once - at_once <= entries
        # The leader never forwards (its own proposals it appends: the test below).
        assert leader.proposals_forwarded_at_once == 0
        await all_applied(nodes, leader, WAIT_S)
    finally:
        for n in nodes:
            n.stop()


# -- a lightly loaded leader appends and sends at once (MetaSyncObj._append_at_once) ---------------------------------
async def test_a_lightly_loaded_leader_appends_its_own_and_forwarded_proposals_at_once_and_packs_a_burst(tmp_path):
    nodes = start_nodes(tmp_path, "append-test-secret", tuning=RaftTuning(propose_coalesce_s=0))
    try:
        leader, on_leader, _, on_follower = await _leader_and_follower(nodes)
        for i in range(20):
            assert (await on_leader.propose({"type": "Barrier"}, f"own-{i}", "system", timeout_s=WAIT_S))["ok"]
        assert leader.entries_appended_at_once == 20   # from propose, nothing of its own in flight each time
        # A follower's lone proposals: appended by the leader right after the poll that read each of them.
        for i in range(20):
            assert (await on_follower.propose({"type": "Barrier"}, f"fwd-{i}", "system", timeout_s=WAIT_S))["ok"]
        assert leader.entries_appended_at_once == 40
        # A burst on the leader: the first goes at once, the rest wait for the tick while it is in flight, which
        # packs them. Appended one by one as they came, each would have been an entry (and a sync).
        appended = leader.entries_appended_at_once
        entries = await _packed_burst(on_leader, leader)
        assert leader.entries_appended_at_once - appended <= entries
        assert all(n.entries_appended_at_once == 0 for n in nodes if n is not leader)
        await all_applied(nodes, leader, WAIT_S)
    finally:
        for n in nodes:
            n.stop()



def test_a_follower_applies_what_a_mark_in_its_ticks_last_poll_committed_before_the_tick_ends(tmp_path):
    # pysyncobj's tick ends in a poll; a leader's mark read there commits entries on a follower (LocalCommit), which
    # pysyncobj would hand to apply only at the next tick's start (MetaSyncObj._apply_marked). Each node ticks on a
    # loop of its own thread, so that a mark can arrive while a follower ticks (on one loop it never does); checked
    # after every tick of both followers while writes enter through one of them.
    base = devcluster.free_base_port()
    addresses = [f"127.0.0.1:{base + i}" for i in range(3)]
    threads = [LoopThread() for _ in addresses]
    nodes: list[MetaSyncObj] = []
    left_unapplied: list[tuple[int, int]] = []
    try:
        for i, thread in enumerate(threads):
            nodes.append(thread.call(start_node, tmp_path / f"n{i}", addresses, i, "marked-test-secret"))
        leader = wait_until(lambda: settled_leader(nodes), WAIT_S, "a leader with a committed membership")
        followers = [i for i, n in enumerate(nodes) if n is not leader]
        for i in followers:
            f, tick = nodes[i], nodes[i]._ticker._tick

            def checked(f=f, tick=tick) -> bool:
                ok = tick()
                if not f.is_leader() and f.raftCommitIndex > f.raftLastApplied:
                    left_unapplied.append((f.raftCommitIndex, f.raftLastApplied))
                return ok
            f._ticker._tick = checked
        entry, loop = nodes[followers[0]], threads[followers[0]].loop
        on_follower = RaftNode(entry, loop, offset_budget=1000)
        for i in range(200):
            outcome = asyncio.run_coroutine_threadsafe(
                on_follower.propose({"type": "Barrier"}, f"w-{i}", "system", timeout_s=WAIT_S), loop).result(WAIT_S)
            assert outcome["ok"], outcome
        assert sum(nodes[i].journal_stats()["local_commits"] for i in followers) > 0, "no follower committed on a mark"
        assert left_unapplied == []
    finally:
        for node, thread in zip(nodes, threads):
            thread.call(node.stop)
        for thread in threads:
            thread.close()
