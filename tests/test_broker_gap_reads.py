"""A pull through a segment sealed past what its holder wrote (broker/reads.py ``_read``). A head fenced before it
wrote all it was given is sealed at its budget end by meta (it cannot report its end): the rest of the segment's
range is a bounded gap, which a pull passes over to the next segment. A real broker node in this process (its
real store and reader; routes set directly, as the watch stream would)."""

from __future__ import annotations

from tests.support.local_routes import one_queue_route as route


async def test_a_pull_passes_the_gap_of_a_segment_its_only_holder_never_wrote(broker_node):
    # Gen 0 on b1 (this broker), sealed at logic 10 with nothing written (b1 was cut off from the moment it got the
    # queue, the simulator's seed 1 with broker partitions); gen 1, on b1 again, takes writes from offset 10. Its one
    # holder is this broker: a pull here was refused 503 BROKER_UNAVAILABLE for ever ("no broker holds it"), while
    # the same pull through another broker, asking b1, passed the gap.
    broker_node.routes.update(route(3, [("b1", 0), ("b1", 1)]))
    assert await broker_node.writer.send("t", 0, [{"body": "m10"}, {"body": "m11"}]) == [10, 11]
    got = await broker_node.reader.pull("t", 0, 0, 10)
    assert [(run.offset, run.count) for run in got["messages"]] == [(10, 2)], got
    assert got["min_offset"] == 0 and got["next_offset"] == 12
