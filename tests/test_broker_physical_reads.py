"""A broker answering for a physical queue of its own that is not in its store (broker/reads.py ``physical_read``).

The log gave it the queue as a new head, and it lost power before it created it: nothing was ever acknowledged there
(a queue exists on disk before its first append is answered), so the queue is empty from its start. Once the segment
left the broker's routes (a route carries only the newest segments), only the asking head knows that start, and
passes it; the chaos runner found pulls across such a range refused with 404 for good."""

from __future__ import annotations

import pytest

from wire.errors import ApiError
from wire.route import Segment


async def test_a_queue_never_created_here_is_empty_from_the_start_the_asker_names(broker_node):
    got = await broker_node.reader.physical_read("t.q0.g4.i7", 0, 10, None, start=40)
    assert got == {"records": [], "min_offset": 40, "max_offset": 40, "offset_for_time": 40}
    with pytest.raises(ApiError) as e:      # nobody says it is this broker's: not found, as before
        await broker_node.reader.physical_read("t.q0.g4.i7", 0, 10)
    assert (e.value.status, e.value.code) == (404, "QUEUE_NOT_FOUND")


async def test_a_queue_in_the_store_is_read_from_the_store_whatever_start_the_asker_names(broker_node):
    seg = Segment("t", 0, 1, "b1", None, "t.q0.g1.i7", 5, 0, None, "active", 1000)
    await broker_node.writer.prepare(seg)
    got = await broker_node.reader.physical_read("t.q0.g1.i7", 0, 10, None, start=40)
    assert (got["min_offset"], got["max_offset"]) == (5, 5)
