"""What a new meta leader counts a silent member's lease against after lease_ms was shortened (meta/groups.py
promise_after_shortening, lease_still_promised_ms; the image keeps the record, meta/group_sessions.py reads it on a
change of leader). tests/test_groups_meta.py runs the same on a real cluster that loses its leader; the simulator's
lease workload (ops/sim/leases.py) runs it under faults."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from meta import groups
from meta.group_sessions import GroupSessions
from tests.support.state_machine_builders import Log


def test_a_shortened_lease_is_remembered_as_long_as_an_answer_may_carry_the_longer_one():
    g = {"lease_promised": groups.promise_after_shortening(None, 6000, ts=10_000)}
    assert g["lease_promised"] == {"lease_ms": 6000, "until_ms": 16_000}
    assert groups.lease_still_promised_ms(g, 12_000) == 6000
    # kept one such lease past until_ms (an answer read the old setting until the change applied), then forgotten
    assert groups.lease_still_promised_ms(g, 21_999) == 6000
    assert groups.lease_still_promised_ms(g, 22_000) == 0
    assert groups.lease_still_promised_ms({}, 12_000) == 0


def test_shortening_again_keeps_the_longest_lease_still_running():
    first = groups.promise_after_shortening(None, 8000, ts=10_000)       # 8 s -> 4 s
    second = groups.promise_after_shortening(first, 4000, ts=12_000)     # 4 s -> 2 s, the 8 s ones still run
    assert second == {"lease_ms": 8000, "until_ms": 18_000}
    # once the earlier record has run out, a new shortening stands alone
    assert groups.promise_after_shortening(first, 4000, ts=30_000) == {"lease_ms": 4000, "until_ms": 34_000}


def _leader_of(log: Log) -> GroupSessions:
    """The lease keeper of a leader whose image is ``log``'s (its expiry decisions, without a node)."""
    reads = SimpleNamespace(read=lambda fn: fn(log.sm.image), image=log.sm.image)
    return GroupSessions(reads, SimpleNamespace(is_leader=lambda: True, term=lambda: 2))


@pytest.mark.parametrize("shortened_after_reset", [True, False])
def test_a_new_leader_counts_a_silent_member_the_lease_of_its_election_even_if_lease_ms_is_shortened_after(
        shortened_after_reset):
    log = Log()
    log.ok({"type": "RegisterBroker", "broker": "b1", "address": "http://127.0.0.1:1"})
    log.ok({"type": "CreateTopic", "topic": "t", "queues": 2})
    log.ok({"type": "SetGroupConfig", "group": "g",
            "config": {"mode": "exclusive", "lease_ms": 6000, "heartbeat_interval_ms": 500}})
    log.ok({"type": "JoinGroup", "group": "g", "member": "m", "topics": ["t"], "mode": "exclusive"})
    keeper = _leader_of(log)
    # Elected at 100 s (monotonic): the old leader's last answer to m may carry 6 s from about now, and m is silent
    keeper._reset(100.0)
    if shortened_after_reset:   # an operator shortens lease_ms once the new leader has started every lease afresh
        log.ok({"type": "SetGroupConfig", "group": "g", "config": {"lease_ms": 2000}}, ts=10**13)
    # Counted only against the setting, m was expired at 102.1 s, seconds before the 6 s its answer promised
    # (the simulator's leases_never_overlap, seeds 18 at 30 s: 1.2 s before; fixed 2026-12-01)
    assert keeper._due(log.sm.image, 105.9) == ({}, {})
    assert keeper._due(log.sm.image, 106.1)[0] == {"g": ["m"]}


def test_a_member_a_new_leader_first_sees_in_its_log_is_counted_the_lease_of_then_too():
    # A join the old leader committed, applied here after the reset: the old leader may have answered it
    log = Log()
    log.ok({"type": "RegisterBroker", "broker": "b1", "address": "http://127.0.0.1:1"})
    log.ok({"type": "CreateTopic", "topic": "t", "queues": 2})
    log.ok({"type": "SetGroupConfig", "group": "g",
            "config": {"mode": "exclusive", "lease_ms": 6000, "heartbeat_interval_ms": 500}})
    keeper = _leader_of(log)
    keeper._reset(100.0)
    log.ok({"type": "JoinGroup", "group": "g", "member": "m", "topics": ["t"], "mode": "exclusive"})
    assert keeper._due(log.sm.image, 100.5) == ({}, {})   # first seen here: its lease starts now
    log.ok({"type": "SetGroupConfig", "group": "g", "config": {"lease_ms": 2000}}, ts=10**13)
    assert keeper._due(log.sm.image, 106.4) == ({}, {})
    assert keeper._due(log.sm.image, 106.6)[0] == {"g": ["m"]}
