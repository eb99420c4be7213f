"""The dead-letter queues of pop consumption (broker/pop/dlq.py) on their own store in a temporary directory: what a
reader of ``GET .../dlq`` gets back, page by page; what a restart finds; the tail scan that tells a dead letter half
done before a crash. tests/test_pop_service.py covers how messages get there."""

from __future__ import annotations

import asyncio
import json

from broker.pop import dlq as dlq_mod
from broker.pop.dlq import DeadLetters
from broker.pop.limits import DLQ_TAIL_SCAN_MAX
from wire import batch

TS_MS = 1_700_000_000_000


def json_message(body: str, key: str | None = None, props: dict | None = None) -> bytes:
    m = {"body": body}
    if key is not None:
        m["key"] = key
    if props is not None:
        m["props"] = props
    return json.dumps(m, separators=(",", ":")).encode()


def entry(origin: int, message: bytes, topic: str = "t", queue: int = 0, attempts: int = 3) -> dict:
    return {"topic": topic, "queue": queue, "origin_offset": origin, "attempts": attempts, "message": message}


async def test_a_read_returns_each_dead_letter_with_where_it_came_from(tmp_path):
    dlq = DeadLetters(str(tmp_path))
    await dlq.append("g", [entry(7, json_message("a", "k1", {"p": "1"}), attempts=2),
                           entry(9, json_message("b"), topic="u", queue=3)], TS_MS)
    binary = batch.record(batch.Message("k2", {"x": "y"}, b"\xff\x00", text=False))
    text = batch.record(batch.Message(None, None, "héllo".encode(), text=True))
    await dlq.append("g", [entry(11, binary), entry(12, text)], TS_MS + 5)
    page = await dlq.read("g", 0, 10)
    assert page["messages"] == [
        {"offset": 0, "topic": "t", "queue": 0, "origin_offset": 7, "attempts": 2, "key": "k1", "props": {"p": "1"},
         "ts": TS_MS, "body": "a"},
        {"offset": 1, "topic": "u", "queue": 3, "origin_offset": 9, "attempts": 3, "key": None, "props": {},
         "ts": TS_MS, "body": "b"},
        {"offset": 2, "topic": "t", "queue": 0, "origin_offset": 11, "attempts": 3, "key": "k2", "props": {"x": "y"},
         "ts": TS_MS + 5, "body_b64": "/wA="},
        {"offset": 3, "topic": "t", "queue": 0, "origin_offset": 12, "attempts": 3, "key": None, "props": {},
         "ts": TS_MS + 5, "body": "héllo"},
    ]
    assert (page["next_offset"], page["min_offset"], page["max_offset"]) == (4, 0, 4)
    assert dlq.sizes == {"g": 4}


async def test_pages_follow_on_from_next_offset_and_stop_at_the_end(tmp_path):
    dlq = DeadLetters(str(tmp_path))
    await dlq.append("g", [entry(i, json_message(f"m{i}")) for i in range(5)], TS_MS)
    first = await dlq.read("g", 0, 2)
    assert [m["offset"] for m in first["messages"]] == [0, 1] and first["next_offset"] == 2
    second = await dlq.read("g", first["next_offset"], 2)
    assert [m["body"] for m in second["messages"]] == ["m2", "m3"] and second["next_offset"] == 4
    last = await dlq.read("g", 4, 2)
    assert [m["origin_offset"] for m in last["messages"]] == [4] and last["next_offset"] == 5
    at_end = await dlq.read("g", 5, 2)
    assert at_end == {"messages": [], "next_offset": 5, "min_offset": 0, "max_offset": 5}
    past_end = await dlq.read("g", 9, 2)
    assert past_end["messages"] == [] and past_end["next_offset"] == 9
    one = await dlq.read("g", 3, 1)
    assert [m["offset"] for m in one["messages"]] == [3] and one["next_offset"] == 4


async def test_a_group_with_no_dead_letters_reads_empty_and_creates_nothing(tmp_path):
    dlq = DeadLetters(str(tmp_path))
    await dlq.append("g", [entry(0, json_message("m"))], TS_MS)
    assert await dlq.read("h", 0, 10) == {"messages": [], "next_offset": 0, "min_offset": 0, "max_offset": 0}
    assert await dlq.read("h", 3, 10) == {"messages": [], "next_offset": 0, "min_offset": 0, "max_offset": 0}
    assert not dlq.holds("h", "t", 0, 0)
    assert dlq_mod.queue_name("h") not in dlq.store and dlq.sizes == {"g": 1}


async def test_groups_are_kept_apart_whatever_their_names_and_counted_again_after_a_restart(tmp_path):
    dlq = DeadLetters(str(tmp_path))
    odd = "orders/EU::retry ü " + "x" * 200   # any group name: the queue is named by its hash
    await dlq.append("g", [entry(i, json_message(f"g{i}")) for i in range(3)], TS_MS)
    await dlq.append(odd, [entry(40, json_message("odd"))], TS_MS)
    assert dlq_mod.queue_name("g") != dlq_mod.queue_name(odd)
    assert dlq_mod.queue_name("g").startswith(dlq_mod.PREFIX) and len(dlq_mod.queue_name(odd)) == \
        len(dlq_mod.PREFIX) + 40
    assert [m["body"] for m in (await dlq.read(odd, 0, 10))["messages"]] == ["odd"]
    dlq.close()
    again = DeadLetters(str(tmp_path))
    try:
        assert again.sizes == {"g": 3, odd: 1}
        assert [m["origin_offset"] for m in (await again.read("g", 0, 10))["messages"]] == [0, 1, 2]
        await again.append("g", [entry(3, json_message("g3"))], TS_MS)
        assert again.sizes["g"] == 4 and (await again.read("g", 3, 10))["messages"][0]["offset"] == 3
    finally:
        again.close()


async def test_holds_finds_a_dead_letter_among_the_newest_records_only(tmp_path):
    dlq = DeadLetters(str(tmp_path))
    await dlq.append("g", [entry(0, json_message("oldest"))], TS_MS)
    await dlq.append("g", [entry(i, json_message("m"), queue=1) for i in range(1, DLQ_TAIL_SCAN_MAX + 1)], TS_MS)
    # the same origin in another topic or queue is another message
    assert dlq.holds("g", "t", 1, DLQ_TAIL_SCAN_MAX) and dlq.holds("g", "t", 1, 1)
    assert not dlq.holds("g", "t", 0, DLQ_TAIL_SCAN_MAX) and not dlq.holds("g", "u", 1, 1)
    # the first record lies one past the scanned tail: a dead letter that old was finished long ago
    assert not dlq.holds("g", "t", 0, 0)
    assert not dlq.holds("g", "t", 1, DLQ_TAIL_SCAN_MAX + 1)


async def test_a_group_s_first_dead_letters_arriving_together_are_all_kept(tmp_path):
    # Appends run on threads: a check for the group's queue then its creation lost to the other append (QueueExists
    # ended the second dead letter's chore, and its message stayed in flight, copied nowhere). Twenty new groups,
    # each with eight dead letters at once: every one is kept, once.
    dlq = DeadLetters(str(tmp_path))
    try:
        for g in range(20):
            await asyncio.gather(*(dlq.append(f"g{g}", [entry(o, json_message(f"m{o}"))], TS_MS) for o in range(8)))
            page = await dlq.read(f"g{g}", 0, 100)
            assert sorted(m["origin_offset"] for m in page["messages"]) == list(range(8))
    finally:
        dlq.close()
