"""Unit and property tests of meta/allocation.py: placement of queues on brokers and the slot range table.

These functions run inside apply, so besides being correct they must be deterministic (same input, same output).
"""

from __future__ import annotations

import copy
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meta import allocation
from tests.support.allocation_checks import minimal_moves

BROKER_NAMES = ["a", "b", "c", "d", "e"]

brokers_st = st.lists(st.sampled_from(BROKER_NAMES), min_size=1, max_size=5, unique=True)


def owner_of_each_slot(table: list[list[int]], slots: int) -> list[int]:
    """Checks that the table partitions [0, slots) (sorted, contiguous, non-empty ranges) and returns slot -> queue."""
    assert table, "empty slot table"
    owners: list[int | None] = [None] * slots
    expected_lo = 0
    for lo, hi, q in table:
        assert lo == expected_lo, f"gap or overlap at {lo} (expected {expected_lo}) in {table}"
        assert lo < hi, f"empty range {[lo, hi, q]}"
        for s in range(lo, hi):
            owners[s] = q
        expected_lo = hi
    assert expected_lo == slots, f"table ends at {expected_lo}, not {slots}"
    return owners  # type: ignore[return-value]


# -- balanced_assignment -------------------------------------------------------------------------------------------
def test_balanced_assignment_spreads_evenly_on_empty_brokers():
    out = allocation.balanced_assignment(range(10), ["c", "a", "b"], {})
    assert sorted(out) == list(range(10))
    counts = Counter(out.values())
    assert set(counts) == {"a", "b", "c"}
    assert max(counts.values()) - min(counts.values()) <= 1
    # ties are broken by name, so the first queue goes to "a"
    assert out[0] == "a"


def test_balanced_assignment_counts_existing_load():
    out = allocation.balanced_assignment(range(3), ["a", "b"], {"a": 5})
    assert out == {0: "b", 1: "b", 2: "b"}
    # a starts with 1: b, then a and b alternate (ties by name); brokers outside the list are ignored
    out = allocation.balanced_assignment(range(4), ["a", "b"], {"a": 1, "zzz": 100})
    assert out == {0: "b", 1: "a", 2: "b", 3: "a"}


def test_balanced_assignment_ignores_duplicate_brokers_and_is_deterministic():
    a = allocation.balanced_assignment([3, 1, 2], ["b", "a", "b"], {"a": 1})
    b = allocation.balanced_assignment([1, 2, 3], ["a", "b"], {"a": 1})
    assert a == b
    assert set(a.values()) <= {"a", "b"}


@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 40), brokers=brokers_st,
       load=st.dictionaries(st.sampled_from(BROKER_NAMES), st.integers(1, 20), max_size=5))
def test_balanced_assignment_is_water_filling(n, brokers, load):
    out = allocation.balanced_assignment(range(n), brokers, load)
    assert sorted(out) == list(range(n))
    assert set(out.values()) <= set(brokers)
    final = {b: load.get(b, 0) for b in brokers}
    for b in out.values():
        final[b] += 1
    # every broker that received a queue was the least loaded when it got its last one
    for b, got in Counter(out.values()).items():
        assert final[b] - 1 <= min(final.values()), (out, load, final)
    if not any(load.get(b, 0) for b in brokers):
        counts = [sum(1 for x in out.values() if x == b) for b in brokers]
        assert max(counts) - min(counts) <= 1
    assert allocation.balanced_assignment(range(n), list(reversed(brokers)), dict(load)) == out


# -- rebalance -----------------------------------------------------------------------------------------------------
def test_rebalance_moves_queues_off_non_targets_only():
    current = {0: "a", 1: "b", 2: "a", 3: "b"}
    moves = allocation.rebalance(current, ["b", "c"])
    assert moves == {0: "c", 2: "c"}


def test_rebalance_spreads_all_queues_from_one_broker():
    current = {q: "a" for q in range(6)}
    moves = allocation.rebalance(current, ["a", "b", "c"])
    final = {**current, **moves}
    assert Counter(final.values()) == Counter({"a": 2, "b": 2, "c": 2})
    assert len(moves) == 4


def test_rebalance_to_current_placement_moves_nothing():
    current = {0: "a", 1: "b", 2: "a", 3: "b"}
    assert allocation.rebalance(current, ["a", "b"]) == {}


def test_rebalance_onto_an_added_broker_moves_one_queue():
    """4 queues on a, b (2 each) remapped onto a, b, c: the balanced result (2, 1, 1) needs exactly one move.

    Adding a broker and remapping onto all brokers is the everyday use of remap; the new broker must get work.
    """
    current = {0: "a", 1: "a", 2: "b", 3: "b"}
    moves = allocation.rebalance(current, ["a", "b", "c"])
    final = {**current, **moves}
    counts = Counter(final.values())
    assert max(counts[b] for b in "abc") - min(counts[b] for b in "abc") <= 1, final
    assert len(moves) == 1, moves


@settings(max_examples=300, deadline=None)
@given(current=st.dictionaries(st.integers(0, 30), st.sampled_from(BROKER_NAMES), min_size=1, max_size=20),
       targets=brokers_st)
def test_rebalance_is_balanced_with_fewest_moves(current, targets):
    moves = allocation.rebalance(current, targets)
    assert set(moves) <= set(current)
    for q, b in moves.items():
        assert b in targets
        assert b != current[q], "a queue 'moved' to the broker it is on"
    final = {**current, **moves}
    assert set(final.values()) <= set(targets), "a queue was left on a broker outside the targets"
    counts = [sum(1 for b in final.values() if b == t) for t in targets]
    assert max(counts) - min(counts) <= 1, (current, targets, final)
    assert len(moves) == minimal_moves(current, targets), (current, targets, moves)


def test_minimal_moves_helper_itself():
    assert minimal_moves({0: "a", 1: "a", 2: "b", 3: "b"}, ["a", "b", "c"]) == 1
    assert minimal_moves({q: "a" for q in range(6)}, ["a", "b", "c"]) == 4
    assert minimal_moves({0: "x", 1: "a"}, ["a"]) == 1


# -- slot tables ---------------------------------------------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_initial_slot_table_partitions_slots_evenly(data):
    slots = data.draw(st.integers(1, 5000))
    queues = data.draw(st.integers(1, min(slots, 300)))
    table = allocation.initial_slot_table(slots, queues)
    owner_of_each_slot(table, slots)
    assert [q for _, _, q in table] == list(range(queues))
    sizes = [hi - lo for lo, hi, _ in table]
    assert max(sizes) - min(sizes) <= 1


def test_initial_slot_table_default_shape():
    assert allocation.initial_slot_table(1024, 4) == [[0, 256, 0], [256, 512, 1], [512, 768, 2], [768, 1024, 3]]
    assert allocation.initial_slot_table(1, 1) == [[0, 1, 0]]


def test_grow_slot_table_splits_the_largest_range_in_half():
    table = allocation.initial_slot_table(8, 2)
    original = copy.deepcopy(table)
    new, splits = allocation.grow_slot_table(table, [2])
    assert table == original, "the input table was mutated"
    assert new == [[0, 2, 0], [2, 4, 2], [4, 8, 1]]
    assert splits == [(2, 0)]


def test_grow_slot_table_refuses_when_nothing_can_split():
    with pytest.raises(ValueError):
        allocation.grow_slot_table([[0, 1, 0], [1, 2, 1]], [2])


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_grow_slot_table_keeps_a_partition_and_names_the_old_owner(data):
    """Successive growths: the table always covers [0, slots) exactly once, each old queue keeps a range, each new
    queue gets slots, and each (new queue, split queue) pair names the queue that owned the new queue's slots before
    the growth: that pair becomes the ordering barrier, so it must name a queue that existed before (DESIGN.md 7)."""
    slots = data.draw(st.integers(1, 64), label="slots")
    queues = data.draw(st.integers(1, slots), label="queues")
    table = allocation.initial_slot_table(slots, queues)
    for _ in range(data.draw(st.integers(1, 4), label="growths")):
        if queues == slots:
            break
        add = data.draw(st.integers(1, slots - queues), label="add")
        before = owner_of_each_slot(table, slots)
        table, splits = allocation.grow_slot_table(table, range(queues, queues + add))
        after = owner_of_each_slot(table, slots)
        assert set(after) == set(range(queues + add)), "some queue owns no slot"
        assert sorted(nq for nq, _ in splits) == list(range(queues, queues + add))
        for nq, old in splits:
            assert 0 <= old < queues, f"barrier of new queue {nq} names queue {old}, which did not exist before"
            moved = [s for s in range(slots) if after[s] == nq]
            assert moved and all(before[s] == old for s in moved), (nq, old, before, after)
        # slots never move between two old queues
        for s in range(slots):
            if after[s] < queues:
                assert after[s] == before[s]
        queues += add


def test_physical_queue_names_are_unique():
    names = {allocation.physical_queue_name(t, i, q, g)
             for t in ("t", "t1", "u") for i in (1, 12) for q in (0, 1, 11) for g in (0, 1, 2)}
    assert len(names) == 3 * 2 * 3 * 3
    assert allocation.physical_queue_name("orders", 7, 3, 2) == "orders.q3.g2.i7"


def test_physical_queue_names_parse_back_and_nothing_else_does():
    name = allocation.physical_queue_name("orders-eu_1", 7, 12, 3)
    assert allocation.parse_physical_queue_name(name) == ("orders-eu_1", 12, 3)
    for bad in ("", "orders", "a.b.c", "t.q1.g2", "t.qx.g2.i3", "t.q1.gy.i3", "t.1.2.3", "t.q1.g2.x3"):
        assert allocation.parse_physical_queue_name(bad) is None, bad
