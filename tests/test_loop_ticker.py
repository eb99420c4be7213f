"""The raft tick on the event loop (meta/raft/loop_ticker.py), on three real raft nodes in the test's process
(MetaSyncObj, pysyncobj, Stator's journal and transport over loopback TCP).

- A tick runs when there is raft work, not when the timer comes round: with the timer all but stopped, every write
  still commits at once; what a tick's last poll read (a follower's acknowledgement) gets a tick of its own.
- A loop held by something else (a long callback) does not hold the tick: the watchdog thread ticks, the leader keeps
  its place. The leader's loop is not its followers' here: two nodes tick on a loop of their own, in a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time

from collections.abc import AsyncIterator

from pysyncobj.poller import POLL_EVENT_TYPE

from meta.raft import loop_ticker
from meta.raft.node import MetaSyncObj, RaftNode, RaftTuning
from ops import devcluster
from tests.support.raft_nodes import LoopThread, all_applied, leader_of, start_node

WAIT_S = 15.0
SECRET = "loop-ticker-test-secret"
WRITES = 20
WRITE_BOUND_S = 1.0     # a write waits milliseconds; one left for the timer would wait TIMER_S
TIMER_S = 30.0
HELD_S = 1.5            # three times the longest election timeout
NO_TICK_WAIT_S = 0.3    # a tick asked for at once runs within milliseconds
MID_TICK_SLEEP_S = 0.005   # a follower's tick, held before its last poll: the leader's answers arrive meanwhile


@contextlib.asynccontextmanager
async def _split_cluster(tmp_path) -> AsyncIterator[tuple[list[MetaSyncObj], LoopThread]]:
    """Three nodes: the first on the test's loop, two on another loop in a thread of its own (so that a follower's
    answer can arrive while the leader ticks, as between processes)."""
    other = LoopThread()
    base = devcluster.free_base_port()
    addresses = [f"127.0.0.1:{base + i}" for i in range(3)]
    nodes: list[MetaSyncObj] = []
    try:
        nodes.append(start_node(tmp_path / "n0", addresses, 0, SECRET))
        nodes += [other.call(start_node, tmp_path / f"n{i}", addresses, i, SECRET) for i in (1, 2)]
        yield nodes, other
    finally:
        for n in nodes[1:]:
            other.call(n.stop)
        if nodes:
            nodes[0].stop()
        other.close()


async def test_every_write_commits_without_waiting_for_the_timer(tmp_path):
    async with _split_cluster(tmp_path) as (nodes, _other):
        leader, raft = await leader_of(nodes, WAIT_S)
        await all_applied(nodes, leader, WAIT_S)
        for n in nodes:   # the next timer tick is TIMER_S away; proposals and sockets are all that ask for ticks
            n._ticker._period_s = TIMER_S
        await asyncio.sleep(0.2)   # the timers already set go off once more
        term = leader.term()
        for i in range(WRITES):
            started = time.monotonic()
            out = await asyncio.wait_for(raft.propose({"type": "RegisterBroker", "broker": f"b{i}",
                                                       "address": "http://10.0.0.1:1"}, None, "test"), TIMER_S)
            took = time.monotonic() - started
            assert out["ok"], out
            assert took < WRITE_BOUND_S, f"write {i} took {took:.3f} s: it waited for a timer tick"
        assert [n.term() for n in nodes] == [term] * 3


async def test_every_write_through_a_follower_commits_without_waiting_for_the_timer(tmp_path):
    # A follower runs no second tick for what its tick's last poll read (MetaSyncObj._follow_up_tick): it acts on it
    # in that tick. Were anything left for a next tick (an acknowledgement unsent, a mark's entries unapplied), a
    # write entered there would wait for the timer, here TIMER_S. The follower is on another thread than the leader,
    # and each of its ticks sleeps (the GIL let go) before the poll that ends it: the leader's messages land there.
    async with _split_cluster(tmp_path) as (nodes, other):
        leader, _raft = await leader_of(nodes, WAIT_S)
        await all_applied(nodes, leader, WAIT_S)
        for n in nodes:
            n._ticker._period_s = TIMER_S
        await asyncio.sleep(0.2)   # the timers already set go off once more
        follower = nodes[1] if leader is nodes[0] else nodes[0]   # a thread of its own: not the leader's loop
        assert leader._follow_up_tick() and not follower._follow_up_tick()
        follower.addOnTickCallback(lambda: time.sleep(MID_TICK_SLEEP_S))   # the callbacks run before the last poll
        # After each of the follower's ticks: no message left unsent, no committed entry left unapplied.
        left: list[tuple[int, int]] = []
        read_at_the_end = [0]   # ticks whose last poll read something: the case under test
        tick, transport = follower._ticker._tick, follower._local.transport

        def checked() -> bool:
            ok = tick()
            read_at_the_end[0] += follower._poller.last_poll_handled
            unsent = sum(map(len, transport._pending.values()))
            left.append((unsent, follower.raftCommitIndex - follower.raftLastApplied))
            return ok
        follower._ticker._tick = checked
        loop = asyncio.get_running_loop() if follower is nodes[0] else other.loop
        through = RaftNode(follower, loop, offset_budget=1000)
        term = leader.term()
        for i in range(WRITES):
            started = time.monotonic()
            proposed = through.propose({"type": "RegisterBroker", "broker": f"f{i}", "address": "http://10.0.0.1:1"},
                                       None, "test")
            if loop is not asyncio.get_running_loop():
                proposed = asyncio.wrap_future(asyncio.run_coroutine_threadsafe(proposed, loop))
            out = await asyncio.wait_for(proposed, TIMER_S)
            took = time.monotonic() - started
            assert out["ok"], out
            assert took < WRITE_BOUND_S, f"write {i} took {took:.3f} s: it waited for a timer tick"
        assert [n.term() for n in nodes] == [term] * 3
        assert len(left) >= WRITES and set(left) == {(0, 0)}, [x for x in left if x != (0, 0)][:5]
        assert read_at_the_end[0] > 0, "no message arrived mid-tick: the case under test never happened"


async def test_a_held_loop_does_not_hold_the_tick(tmp_path):
    async with _split_cluster(tmp_path) as (nodes, other):
        leader, _raft = await leader_of(nodes, WAIT_S)
        await all_applied(nodes, leader, WAIT_S)
        term, slow = leader.term(), leader.slow_ticks
        held_by_watchdog = leader._ticker.watchdog_ticks
        if leader is nodes[0]:
            time.sleep(HELD_S)   # the test's loop, the leader's, is held
        else:
            other.call(time.sleep, HELD_S)
        assert [n.term() for n in nodes] == [term] * 3, "the leader's held loop cost an election"
        assert leader.is_leader()
        assert leader._ticker.watchdog_ticks > held_by_watchdog, "nobody ticked while the loop was held"
        assert leader.slow_ticks == slow


@contextlib.contextmanager
def _an_arrival_read_by_the_last_poll_of_the_first_tick(follow_up=lambda: True):
    """A started ticker whose first tick has a message arrive (a pipe's write) and read by the poll that ends it;
    yields, per tick so far, how many arrivals it saw at its start, and the arrivals read."""
    poller = loop_ticker.LoopPoller()
    read, write = os.pipe()
    os.set_blocking(read, False)
    arrived: list[bytes] = []
    poller.subscribe(read, lambda fd, mask: arrived.append(os.read(fd, 64)), POLL_EVENT_TYPE.READ)
    ticks: list[int] = []

    def tick() -> bool:
        ticks.append(len(arrived))
        if len(ticks) == 1:
            os.write(write, b"ack")   # arrives during the tick...
        poller.poll(0)                # ...and the tick's last poll reads it
        return True
    ticker = loop_ticker.LoopTicker(tick, poller, TIMER_S, follow_up=follow_up)
    try:
        ticker.start(asyncio.get_running_loop())   # asks for a first tick
        yield ticks, arrived
    finally:
        ticker.stop()
        os.close(read)
        os.close(write)


async def test_what_the_last_poll_of_a_tick_read_gets_a_tick_of_its_own(monkeypatch):
    # Between processes a follower's acknowledgement often arrives while the leader ticks (during its sync), and the
    # poll that ends the tick reads it; the commit index moves at the start of a tick. Nothing is left to read, so
    # no descriptor asks for that tick: the ticker must. (Without it, p99 of a 1-client write was the timer's 50 ms.)
    monkeypatch.setattr(loop_ticker, "STALL_S", TIMER_S)   # the watchdog would tick too, later: not what is tested
    with _an_arrival_read_by_the_last_poll_of_the_first_tick() as (ticks, arrived):
        deadline = time.monotonic() + WRITE_BOUND_S
        while len(ticks) < 2:
            assert time.monotonic() < deadline, f"no second tick: {ticks}"
            await asyncio.sleep(0.001)
        assert ticks[:2] == [0, 1] and arrived == [b"ack"], (ticks, arrived)


async def test_a_node_that_acted_on_its_last_poll_gets_no_tick_for_it(monkeypatch):
    # The same arrival, with a node that says it acted on what it read (a follower): no second tick.
    monkeypatch.setattr(loop_ticker, "STALL_S", TIMER_S)
    asked: list[bool] = []
    with _an_arrival_read_by_the_last_poll_of_the_first_tick(lambda: asked.append(True) or False) as (ticks, arrived):
        await asyncio.sleep(NO_TICK_WAIT_S)
        assert ticks == [0] and arrived == [b"ack"] and asked == [True], (ticks, arrived, asked)


def test_the_watchdog_steps_in_well_inside_an_election_timeout():
    assert loop_ticker.STALL_S + loop_ticker.WATCHDOG_PERIOD_S < RaftTuning().election_timeout_min_s / 2


def test_work_between_ticks_runs_only_while_no_tick_does():
    # MetaSyncObj._send_at_once sends a proposal from the loop between two ticks: never while the watchdog
    # thread ticks (it holds the tick's lock), never once the ticker stops.
    ticker = loop_ticker.LoopTicker(lambda: True, loop_ticker.LoopPoller(), TIMER_S)
    ran: list[int] = []
    assert ticker.between_ticks(lambda: ran.append(1) or True) is True
    assert ticker.between_ticks(lambda: False) is False   # the work's own answer
    with ticker._lock:   # a tick in progress
        assert ticker.between_ticks(lambda: ran.append(2) or True) is False
    ticker.stop()
    assert ticker.between_ticks(lambda: ran.append(3) or True) is False
    assert ran == [1]
