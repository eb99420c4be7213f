"""client/slots.py: the same CRC-32 in every language, and a slot table that maps every slot to exactly one queue."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from client.slots import SlotTable, queue_for_key, queue_for_slot, slot_of
from meta import allocation

# Standard CRC-32 (IEEE 802.3) check values, as published with every implementation (zlib, Go's hash/crc32, Java's
# java.util.zip.CRC32): any client in any language must produce these.
CRC32_VECTORS = [
    ("", 0x00000000),
    ("a", 0xE8B7BE43),
    ("abc", 0x352441C2),
    ("123456789", 0xCBF43926),
    ("message digest", 0x20159D7F),
    ("The quick brown fox jumps over the lazy dog", 0x414FA339),
]


@pytest.mark.parametrize("key,crc", CRC32_VECTORS)
def test_slot_is_crc32_mod_slots(key, crc):
    assert slot_of(key, 1 << 32) == crc
    assert slot_of(key, 1024) == crc % 1024
    assert slot_of(key, 7) == crc % 7


def crc32_reference(data: bytes) -> int:
    """Bit-by-bit CRC-32 (reflected polynomial 0xEDB88320, init and final xor 0xFFFFFFFF): what another language's
    client would write without a library."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0xEDB88320 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


@pytest.mark.parametrize("key,crc", CRC32_VECTORS)
def test_reference_crc_agrees_with_vectors(key, crc):
    assert crc32_reference(key.encode()) == crc


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40), st.integers(1, 65536))
def test_str_keys_are_hashed_as_utf8(key, slots):
    assert slot_of(key, slots) == crc32_reference(key.encode("utf-8")) % slots == slot_of(key.encode("utf-8"), slots)


def test_non_ascii_key():
    assert slot_of("é", 1 << 32) == crc32_reference(b"\xc3\xa9")


def test_slot_needs_positive_slots():
    with pytest.raises(ValueError, match="^slots must be positive$"):
        slot_of("k", 0)


def test_lookup_at_range_edges():
    table = [[0, 10, 2], [10, 11, 0], [11, 16, 1]]
    assert [queue_for_slot(table, s) for s in (0, 9, 10, 11, 15)] == [2, 2, 0, 1, 1]
    with pytest.raises(ValueError, match=r"^slot 16 is outside \[0, 16\)$"):
        queue_for_slot(table, 16)
    with pytest.raises(ValueError, match=r"^slot -1 is outside \[0, 16\)$"):
        queue_for_slot(table, -1)
    checked = SlotTable(table)   # a checked table is used as it is
    assert [queue_for_slot(checked, s) for s in (0, 9, 10, 11, 15)] == [2, 2, 0, 1, 1]


@pytest.mark.parametrize("table, message", [
    ([], "empty slot table"),
    ([[0, 5, 0], [6, 10, 1]], "slot table has a gap or an overlap at slot 5"),
    ([[0, 6, 0], [5, 10, 1]], "slot table has a gap or an overlap at slot 5"),
    ([[1, 10, 0]], "slot table has a gap or an overlap at slot 0"),     # does not start at 0
    ([[0, 0, 0], [0, 10, 1]], r"slot table has an empty range \[0, 0\)"),
    ([[0, 10, -1]], r"slot table maps \[0, 10\) to a negative queue -1"),
])
def test_bad_tables_are_refused(table, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        SlotTable(table)


def test_table_must_cover_the_topics_slots():
    with pytest.raises(ValueError, match=r"^slot table covers \[0, 10\), not \[0, 16\)$"):
        SlotTable([[0, 10, 0]], slots=16)


def test_queue_for_key_refuses_a_route_whose_table_does_not_cover_its_slots():
    with pytest.raises(ValueError, match=r"^slot table covers \[0, 10\), not \[0, 16\)$"):
        queue_for_key({"slots": 16, "slot_table": [[0, 10, 0]]}, "k")


def test_queue_for_key_uses_the_route():
    route = {"slots": 4, "slot_table": [[2, 4, 1], [0, 2, 0]]}  # unsorted on purpose
    for key in ("a", "b", "c", "order-17"):
        assert queue_for_key(route, key) == (0 if slot_of(key, 4) < 2 else 1)


@st.composite
def slot_tables(draw):
    """A random partition of [0, slots) into contiguous ranges, each given a random queue, listed in random order."""
    slots = draw(st.integers(1, 4096))
    cuts = sorted(draw(st.sets(st.integers(1, slots - 1), max_size=min(40, slots - 1)))) if slots > 1 else []
    bounds = [0, *cuts, slots]
    table = [[lo, hi, draw(st.integers(0, 50))] for lo, hi in zip(bounds, bounds[1:])]
    return slots, draw(st.permutations(table))


@settings(max_examples=200, deadline=None)
@given(slot_tables(), st.data())
def test_every_slot_maps_to_exactly_one_queue(case, data):
    slots, table = case
    t = SlotTable(table, slots)
    owners = {}
    for lo, hi, q in table:
        for s in range(lo, hi):
            assert s not in owners
            owners[s] = q
    assert sorted(owners) == list(range(slots))
    for s in data.draw(st.lists(st.integers(0, slots - 1), min_size=1, max_size=50)):
        assert t.queue_of(s) == owners[s] == queue_for_slot(table, s)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 2048), st.integers(1, 64), st.integers(0, 64), st.text(max_size=20))
def test_meta_tables_after_growth_cover_every_slot(slots, queues, grow, key):
    """The tables meta builds (initial, then grown) are accepted and send every key to a queue that exists."""
    queues = min(queues, slots)
    table = allocation.initial_slot_table(slots, queues)
    new = min(queues + grow, slots)
    if new > queues:
        table, _ = allocation.grow_slot_table(table, range(queues, new))
    t = SlotTable(table, slots)
    assert 0 <= t.queue_of_key(key) < new
    assert {q for _, _, q in table} == set(range(new))
