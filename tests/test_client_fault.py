"""client/fault.py: latency fault avoidance per physical broker, on an injected clock."""

from __future__ import annotations

import pytest

from client.fault import FAILED_SEND_LATENCY_MS, LatencyFaultAvoidance, avoidance_ms


class Clock:
    def __init__(self) -> None:
        self.ms = 1_000_000.0

    def __call__(self) -> float:
        return self.ms


def queues(*brokers: str, unwritable: tuple[int, ...] = ()) -> list[dict]:
    return [{"queue": i, "broker": b, "writable": i not in unwritable} for i, b in enumerate(brokers)]


@pytest.mark.parametrize("latency,avoid", [
    (0, 0), (49, 0), (50, 0), (99, 0), (100, 0), (549, 0), (550, 2000), (1799, 2000), (1800, 5000),
    (3000, 6000), (4999, 6000), (5000, 10000), (14999, 10000), (15000, 30000), (10 ** 9, 30000),
])
def test_latency_to_avoidance(latency, avoid):
    assert avoidance_ms(latency) == avoid


def test_failure_counts_as_ten_seconds():
    clock = Clock()
    f = LatencyFaultAvoidance(clock_ms=clock)
    f.update("b1", 3, failed=True)
    assert f.latency_ms("b1") == FAILED_SEND_LATENCY_MS
    assert not f.is_available("b1")
    clock.ms += 9_999
    assert not f.is_available("b1")
    clock.ms += 1
    assert f.is_available("b1")


def test_a_fast_send_makes_a_broker_available_again():
    clock = Clock()
    f = LatencyFaultAvoidance(clock_ms=clock)
    f.update("b1", 2000)
    assert not f.is_available("b1")
    f.update("b1", 10)
    assert f.is_available("b1")


def test_unknown_brokers_are_available_and_disabled_tracks_nothing():
    clock = Clock()
    f = LatencyFaultAvoidance(clock_ms=clock)
    assert f.is_available("never-seen")
    off = LatencyFaultAvoidance(enabled=False, clock_ms=clock)
    off.update("b1", 0, failed=True)
    assert off.is_available("b1")


def test_avoidance_is_per_broker_not_per_queue():
    """Queues 0 and 2 share b1: one slow send to b1 steers picks away from both."""
    clock = Clock()
    f = LatencyFaultAvoidance(clock_ms=clock)
    qs = queues("b1", "b2", "b1", "b3")
    f.update("b1", 600)
    assert [f.pick(qs, start) for start in range(4)] == [1, 1, 3, 3]
    clock.ms += 2000
    assert [f.pick(qs, start) for start in range(4)] == [0, 1, 2, 3]


def test_pick_prefers_available_then_soonest_available_then_any():
    clock = Clock()
    f = LatencyFaultAvoidance(clock_ms=clock)
    qs = queues("b1", "b2", "b3")
    f.update("b1", 20_000)   # 30 s
    f.update("b2", 2_000)    # 5 s
    assert f.pick(qs, 0) == 2
    f.update("b3", 3_500)    # 6 s
    assert f.pick(qs, 0) == 1                       # all avoided: b2 comes back first
    assert f.pick(queues("b1", "b2", "b3", unwritable=(1,)), 0) == 2   # b3 next, b2 is not writable
    assert f.pick(queues("b1", "b2", unwritable=(0, 1)), 1) == 1       # nothing writable: the start


def test_pick_skips_the_broker_that_just_failed():
    f = LatencyFaultAvoidance(enabled=False)
    qs = queues("b1", "b1", "b2")
    assert f.pick(qs, 0, avoid_broker="b1") == 2
    assert f.pick(queues("b1", "b1"), 1, avoid_broker="b1") == 1      # only b1 has queues: stay


def test_tracked_brokers_are_bounded():
    f = LatencyFaultAvoidance(clock_ms=Clock(), brokers_max=3)
    for i in range(10):
        f.update(f"b{i}", 600)
    assert [f.latency_ms(f"b{i}") for i in (0, 6, 7, 8, 9)] == [None, None, 600, 600, 600]
