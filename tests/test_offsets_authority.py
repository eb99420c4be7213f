"""Who may speak for a group's committed offset (broker/writes.py ``offsets_head``, broker/reads.py
``read_committed``): the queue's head, and only while it may take writes. A real broker node in this process (its
real store, offsets file and reader; routes and session set directly, as the watch stream and meta link would).

Commits are stored with their head's gen and the newest gen wins, so a commit acknowledged on a head that was
already sealed (the remap's new head takes commits of a higher gen) or on a broker whose session lapsed (meta may
have moved the queue without it) could be lost; and a read answered there could miss a newer head's commits: the
600 s chaos run read a committed offset of 5227 after 6585 had been acknowledged, across a remap and a restart."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.support.held_syncs import WAIT_S, HeldSyncs
from tests.support.local_routes import one_queue_route as route
from wire.errors import ApiError


@pytest.fixture
async def node(broker_node):
    broker_node.routes.update(route(5, [("b1", 0)]))
    return broker_node


async def refused(awaitable) -> tuple[int, str]:
    with pytest.raises(ApiError) as e:
        await awaitable
    return e.value.status, e.value.code


async def test_a_sealed_head_neither_takes_nor_answers_commits(node):
    await node.writer.commit_offset("g", "t", 0, 5)
    assert await node.reader.read_offset("g", "t", 0, False) == 5
    await node.writer.seal(node.routes.head("t", 0))   # meta's remap sealed it; the new route has not come yet
    assert await refused(node.writer.commit_offset("g", "t", 0, 7)) == (503, "SEALING")
    assert await refused(node.reader.read_offset("g", "t", 0, False)) == (503, "SEALING")
    # a newer head asking for this broker's own value (local) still gets it, with its gen
    assert await node.reader.read_committed("g", "t", 0, True) == (5, 0)


async def test_a_commit_whose_fsync_a_seal_overtakes_is_not_acknowledged(node, monkeypatch):
    held = HeldSyncs(monkeypatch)
    commit = asyncio.create_task(node.writer.commit_offset("g", "t", 0, 9))
    await held.wait_entered()
    await node.writer.seal(node.routes.head("t", 0))
    held.let_go()
    assert await refused(asyncio.wait_for(commit, WAIT_S)) == (503, "SEALING")
    held.check()


async def test_a_budget_renewal_during_a_commit_is_not_mistaken_for_a_remap(node, monkeypatch):
    # A renewal rewrites the head's budget_end in the route, nothing else: the head is the same segment.
    held = HeldSyncs(monkeypatch)
    commit = asyncio.create_task(node.writer.commit_offset("g", "t", 0, 9))
    await held.wait_entered()
    node.routes.update(route(6, [("b1", 0)], budget_end=2_000_000))
    held.let_go()
    assert await asyncio.wait_for(commit, WAIT_S) == 9
    assert await node.reader.read_offset("g", "t", 0, False) == 9
    held.check()


async def test_a_broker_whose_session_lapsed_neither_takes_nor_answers_commits(node):
    await node.writer.commit_offset("g", "t", 0, 5)
    node.session.last_ack_sent = time.monotonic() - node.session.session_timeout_ms / 1000 - 1
    assert await refused(node.writer.commit_offset("g", "t", 0, 7)) == (503, "FENCED")
    assert await refused(node.reader.read_offset("g", "t", 0, False)) == (503, "FENCED")
    node.session.last_ack_sent = time.monotonic()        # renewed
    assert await node.reader.read_offset("g", "t", 0, False) == 5


async def test_a_broker_that_is_no_longer_the_head_sends_readers_to_it(node):
    await node.writer.commit_offset("g", "t", 0, 5)
    node.routes.update(route(6, [("b1", 0), ("b2", 1)]))   # remapped to b2, which may hold newer commits
    assert await refused(node.reader.read_offset("g", "t", 0, False)) == (409, "NOT_LEADER")
    assert await refused(node.writer.commit_offset("g", "t", 0, 7)) == (409, "NOT_LEADER")
    assert await node.reader.read_committed("g", "t", 0, True) == (5, 0)
