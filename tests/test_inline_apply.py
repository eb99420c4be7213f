"""Small entries applied by the raft tick (meta/raft/applier.py ``run_inline``), on three real raft nodes in the
test's process (MetaSyncObj, pysyncobj, Stator's journal and transport over loopback TCP; each ticks on the test's
event loop, meta/raft/loop_ticker.py).

- An entry of cheap commands only (node.INLINE_APPLY) is applied by the tick; any other kind by the apply thread,
  on every node, in log order either way.
- A backlog (a node catching up) is the apply thread's, however cheap each entry, and is decoded there too.
- A reader holding the image lock (a large route rendered on a worker thread) never holds the tick: the entry goes
  to the apply thread, which waits for the lock, while the tick goes on (no election, no slow tick).
"""

from __future__ import annotations

import asyncio
import threading

from meta.raft.applier import INLINE_ENTRIES_MAX, Applier
from meta.raft.entry import decode_entry
from meta.raft import node as node_module
from meta.raft.node import INLINE_APPLY, LoopBridge, MetaSyncObj, RaftTuning
from tests.support.raft_nodes import all_applied, leader_of, start_nodes

WAIT_S = 15.0
BACKLOG = 300   # entries a stopped follower misses, then gets at once
HELD_S = 1.5   # three times the longest election timeout (RaftTuning): a held tick would cost the leader


def _record_threads(nodes: list[MetaSyncObj]) -> dict[str, list[tuple[int, str, str]]]:
    """Per node, (index, applying thread's name, command type) of every entry of the test's commands applied from
    now on (a new leader's membership entry may still be on its way to a follower: left out)."""
    seen: dict[str, list[tuple[int, str, str]]] = {}
    for n in nodes:
        applied = seen.setdefault(n.selfNode.address, [])
        inner = n._applier._apply

        def apply(index, entry, inner=inner, applied=applied):
            types = [e["cmd"]["type"] for e in decode_entry(entry.payload)] if entry.payload is not None else []
            if any(t in ("RegisterBroker", "DeleteTopic") for t in types):
                applied.append((index, threading.current_thread().name, "+".join(types)))
            return inner(index, entry)
        n._applier._apply = apply
    return seen


async def test_cheap_entries_are_applied_on_the_tick_thread_and_others_on_the_apply_thread(tmp_path):
    assert "RegisterBroker" in INLINE_APPLY and "DeleteTopic" not in INLINE_APPLY
    nodes = start_nodes(tmp_path, "inline-apply-test-secret")
    try:
        leader, raft = await leader_of(nodes, WAIT_S)
        await all_applied(nodes, leader, WAIT_S)
        seen = _record_threads(nodes)
        cheap = await raft.propose({"type": "RegisterBroker", "broker": "b1", "address": "http://10.0.0.1:1"},
                                   None, "test")
        assert cheap["ok"], cheap
        # Not cheap by kind, whatever this one does (a topic that is not there: refused, the same on every node).
        other = await raft.propose({"type": "DeleteTopic", "topic": "nope"}, None, "test")
        assert not other["ok"], other
        await all_applied(nodes, leader, WAIT_S)
        for address, applied in seen.items():
            assert [kind for _i, _name, kind in applied] == ["RegisterBroker", "DeleteTopic"], (address, applied)
            threads = [name for _index, name, _kind in applied]
            assert threads[1] == "raft-apply" and threads[0] != "raft-apply", (address, applied)
            assert applied[0][0] < applied[1][0], (address, applied)
    finally:
        for n in nodes:
            n.stop()


async def test_a_reader_holding_the_image_lock_does_not_hold_the_tick(tmp_path):
    nodes = start_nodes(tmp_path, "inline-apply-test-secret")
    released = threading.Event()
    try:
        leader, raft = await leader_of(nodes, WAIT_S)
        await all_applied(nodes, leader, WAIT_S)
        term, slow = leader.term(), leader.slow_ticks
        seen = _record_threads([leader])
        holding = threading.Event()

        def reader() -> None:   # a route rendered under the lock, for longer than any election timeout
            with leader.image_lock:
                holding.set()
                released.wait(WAIT_S)
        threading.Thread(target=reader, name="long-reader", daemon=True).start()
        assert holding.wait(WAIT_S)
        write = asyncio.ensure_future(raft.propose({"type": "RegisterBroker", "broker": "b2",
                                                    "address": "http://10.0.0.2:1"}, None, "test"))
        await asyncio.sleep(HELD_S)
        assert not write.done(), "applied while a reader held the image lock"
        # A held leader cannot see its own fall (it does not tick): its followers' terms tell.
        assert [n.term() for n in nodes] == [term] * 3, "the tick was held: the followers elected another leader"
        assert leader.is_leader()
        assert leader.slow_ticks == slow, "a tick waited for the image lock"
        released.set()
        out = await asyncio.wait_for(write, WAIT_S)
        assert out["ok"], out
        assert [name for _i, name, _kind in seen[leader.selfNode.address]] == ["raft-apply"], seen
        assert all(n.term() == term for n in nodes), [n.term() for n in nodes]
    finally:
        released.set()
        for n in nodes:
            n.stop()


def test_a_backlog_of_cheap_entries_goes_to_the_apply_thread():
    # A node catching up has thousands of entries committed at once: applied in one tick they held it (and the loop
    # it runs on) for 1-2 s. Past INLINE_ENTRIES_MAX queued items the apply thread takes them, in order.
    applied: list[tuple[int, str]] = []
    done = threading.Event()
    last = INLINE_ENTRIES_MAX + 1

    def apply(index, _work):
        applied.append((index, threading.current_thread().name))
        if index == last:
            done.set()
    applier = Applier(apply, lambda: None)
    applier.start()
    lock = threading.RLock()
    try:
        for index in range(1, INLINE_ENTRIES_MAX + 1):
            applier.submit(index, None, inline=True)
        applier.run_inline(lock)   # a batch it may take: here
        assert [name for _i, name in applied] == [threading.current_thread().name] * INLINE_ENTRIES_MAX
        applier.submit(last, None, inline=True)
        for index in range(last + 1, last + INLINE_ENTRIES_MAX + 1):
            applier.submit(index, None, inline=True)
        applier.run_inline(lock)   # one more than it may take: the thread's
        assert done.wait(WAIT_S)
        assert applier.idle() or done.is_set()
    finally:
        applier.stop()
    assert [i for i, _ in applied] == list(range(1, last + INLINE_ENTRIES_MAX + 1))
    assert {name for i, name in applied if i >= last} == {"raft-apply"}, applied[INLINE_ENTRIES_MAX:]


async def test_a_node_catching_up_decodes_its_backlog_on_the_apply_thread(tmp_path, monkeypatch):
    # A restarted node is handed thousands of committed entries in one tick; decoding each there (to see whether the
    # tick may apply it) held its first tick, and its event loop, for 1.6-1.7 s in vs_etcd's failovers.
    nodes = start_nodes(tmp_path, "inline-apply-test-secret")
    again = None
    try:
        leader, raft = await leader_of(nodes, WAIT_S)
        await all_applied(nodes, leader, WAIT_S)
        i, behind = next((i, n) for i, n in enumerate(nodes) if n is not leader)
        address, partners = behind.selfNode.address, [n.selfNode.address for n in nodes if n is not behind]
        behind.stop()
        for k in range(BACKLOG):
            assert (await raft.propose({"type": "RegisterBroker", "broker": f"b{k}",
                                        "address": "http://10.0.0.1:1"}, None, "test"))["ok"]
        decoded: list[tuple[str, int | None]] = []   # (thread, committed entries after the one decoded)

        def recording(payload):
            # pysyncobj hands entries over in order and counts each applied after the hook returns, so this is
            # the commit index less the entry's own index (None while the node is still being built)
            after = again.raftCommitIndex - again.raftLastApplied - 1 if again is not None else None
            decoded.append((threading.current_thread().name, after))
            return decode_entry(payload)
        monkeypatch.setattr(node_module, "decode_entry", recording)
        again = MetaSyncObj(address, partners, str(tmp_path / f"n{i}"), "inline-apply-test-secret", RaftTuning(),
                            lambda version, changed: None, LoopBridge())
        again.bridge.loop = asyncio.get_running_loop()
        again.start()
        await all_applied([again], leader, WAIT_S)
        # The rule, not a count: the tick decodes only an entry with fewer than INLINE_ENTRIES_MAX committed after
        # it (the backlog's last ones; and the node's own committed tail, if its first tick came before the
        # leader's: a count of 64 failed on that one entry more)
        in_tick = [after for name, after in decoded if name != "raft-apply"]
        on_thread = [after for name, after in decoded if name == "raft-apply"]
        assert len(decoded) >= BACKLOG and len(on_thread) >= BACKLOG - INLINE_ENTRIES_MAX, (len(decoded), len(on_thread))
        assert all(b is not None and b < INLINE_ENTRIES_MAX for b in in_tick), in_tick
    finally:
        for n in nodes:
            if n is not behind:
                n.stop()
        if again is not None:
            again.stop()
