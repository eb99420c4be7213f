"""A leader that was not listening fences no broker for it; a broker beats from send to send.

CI once saw a broker's queue jump by its offset budget in the 4,096-queue remap test (tests/test_max_topic.py): a
session lapsed on a loaded machine, the segment was sealed at its budget's end. Heartbeats there were 3-4 s apart
instead of 2 (the answer's wait was added to the interval) and arrived late at a busy leader. Both ends are held here:
the tracker's arithmetic in process, and a real meta node paused past the session timeout.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

from broker.meta_link import MetaLink
from broker.session import MetaSession
from meta.broker_sessions import CHECK_STALL_MS, SessionTracker
from tests.support import cluster as cluster_mod
from tests.support.meta_http import wait_until
from tests.support.metrics import scrape, value

TIMEOUT_MS, CHECK_MS = 9_000, 250
SESSION_TIMEOUT_MS = 3_000
HEARTBEAT_INTERVAL_MS = 500
PAUSE_S = 7.0                   # more than twice the session timeout: without the stall rule the resumed leader fences
SETTLE_S = 30.0


def _started(active: list[tuple[str, int]]) -> tuple[SessionTracker, list[tuple[str, int]]]:
    """A tracker whose leader began to lead at 0 ms, with these (broker, epoch) sessions active."""
    t = SessionTracker(TIMEOUT_MS, CHECK_MS)
    t.reset(active, 0)
    return t, active


def _checked_every(tracker: SessionTracker, active, start_ms: int, end_ms: int) -> dict[int, list]:
    """Checks on time from ``start_ms`` to ``end_ms``: when each found which brokers expired."""
    out = {}
    for now in range(start_ms, end_ms + 1, CHECK_MS):
        out[now] = tracker.expired(active, now)
        tracker.looked(now)
    return out


def test_a_silent_broker_expires_after_the_timeout_when_the_leader_checks_on_time():
    t, active = _started([("b1", 4)])
    seen = _checked_every(t, active, CHECK_MS, 10_000)
    first = min(now for now, expired in seen.items() if expired)
    assert first == 9_250 and seen[first] == [("b1", 4)]   # the first check past 9,000 ms of silence
    assert t.stalls == 0 and t.checks == len(seen)


def test_a_stalled_check_counts_the_stall_against_no_session():
    t, active = _started([("b1", 4), ("b2", 7)])
    t.heartbeat("b1", 4, 1_000, 0)
    t.heartbeat("b2", 7, 2_000, 0)
    t.looked(2_000)
    # The leader's loop stalls for 20 s: nothing it could have read was read.
    assert t.expired(active, 22_000) == [] and t.stalls == 1
    t.looked(22_000)
    # The stall is taken out of each session: each lapses after 9 s of the leader's listening since it was heard.
    seen = _checked_every(t, active, 22_250, 40_000)
    b1 = min(now for now, expired in seen.items() if ("b1", 4) in expired)
    b2 = min(now for now, expired in seen.items() if ("b2", 7) in expired)
    assert (b1, b2) == (29_750 + CHECK_MS, 30_750 + CHECK_MS)
    assert t.stalls == 1


def test_a_check_late_by_less_than_the_stall_bound_forgives_nothing():
    t, active = _started([("b1", 4)])
    t.looked(8_000)
    assert t.expired(active, 8_000 + CHECK_MS + CHECK_STALL_MS) == [("b1", 4)]   # 9,250 ms of silence
    assert t.stalls == 0
    t, active = _started(active)
    t.looked(7_999)
    assert t.expired(active, 7_999 + CHECK_MS + CHECK_STALL_MS + 1) == [], "late enough to be a stall"
    assert t.stalls == 1


def test_a_heartbeat_read_during_a_late_check_is_never_moved_past_now():
    t, active = _started([("b1", 4)])      # its last check at 0
    t.heartbeat("b1", 4, 4_000, 0)      # read while the check was late: the loop ran, the checker did not
    assert t.expired(active, 5_000) == [] and t.stalls == 1
    t.looked(5_000)
    # its session is counted from 5,000 at the latest (the check's now), never from later
    seen = _checked_every(t, active, 5_000 + CHECK_MS, 20_000)
    assert min(now for now, expired in seen.items() if expired) == 5_000 + TIMEOUT_MS + CHECK_MS


async def test_a_paused_leader_fences_no_broker_and_brokers_keep_their_epoch(tmp_path):
    async with cluster_mod.running(str(tmp_path), 1, 1, meta={"session_timeout_ms": SESSION_TIMEOUT_MS,
                                                               "heartbeat_interval_ms": HEARTBEAT_INTERVAL_MS}) as c:
        m = c.meta_urls[0]

        async def b1():   # None until the node answers (it may still be electing itself) and b1 is active
            s, b, _ = await c.call("GET", m + "/v1/brokers", "client")
            if s != 200:
                return None
            return next((x for x in b["brokers"] if x["broker"] == "b1" and x["state"] == "active"), None)
        before = await wait_until(b1, SETTLE_S, "b1 registered")

        async def checking():   # the leader's first check of its term only starts every session afresh: a pause
            s = await scrape(c.session, m)   # before the second would be forgiven by that reset, not by the stall rule
            return s if value(s, "stator_meta_broker_session_checks_total") > 0 else None
        counted = await wait_until(checking, SETTLE_S, "the leader checking sessions")
        stalls = value(counted, "stator_meta_broker_session_check_stalls_total")
        assert value(counted, "stator_meta_broker_session_expiries_total") == 0

        os.kill(c.pid("m1"), signal.SIGSTOP)
        try:
            await asyncio.sleep(PAUSE_S)
        finally:
            os.kill(c.pid("m1"), signal.SIGCONT)

        async def checked_since():   # the first session check after the pause: a stall found, or a fence
            s = await scrape(c.session, m)
            found = value(s, "stator_meta_broker_session_check_stalls_total") > stalls
            return s if found or value(s, "stator_meta_broker_session_expiries_total") > 0 else None
        counted = await wait_until(checked_since, SETTLE_S, "a session check after the pause")
        assert value(counted, "stator_meta_broker_session_expiries_total") == 0, "the stall was counted as silence"
        assert value(counted, "stator_meta_broker_session_check_stalls_total") == stalls + 1

        after = await wait_until(b1, SETTLE_S, "b1 active")
        assert after["epoch"] == before["epoch"], (before, after)


async def test_heartbeats_go_out_an_interval_apart_from_send_to_send_however_slow_the_answer():
    """An answer that takes most of the interval is not added to it (meta counts silence from send to send)."""
    link = MetaLink.__new__(MetaLink)    # the loop alone: its heartbeat is the stand-in below
    link.session = MetaSession()
    link.session.heartbeat_interval_ms = 1_000
    sent: list[float] = []

    async def slow_heartbeat():
        sent.append(time.monotonic())
        await asyncio.sleep(0.8)         # the answer comes 800 ms after the send

    async def four_sent():
        return len(sent) >= 4
    link._heartbeat = slow_heartbeat
    task = asyncio.create_task(link._heartbeat_loop())
    try:
        await wait_until(four_sent, 20, "four heartbeats")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    gaps = [b - a for a, b in zip(sent, sent[1:])]
    assert all(0.99 <= g < 1.6 for g in gaps), gaps   # 1.8 s apart when the wait began at the answer
