"""Decisions about segments a broker reports sealed: where a segment being sealed ends, and so where its successor's
logic offsets start (DESIGN.md "The flow of one remap": the second half; the first, the seal-then-switch, is
topics.move). A broker's fence seals at the budget's end instead (lookups.seal_at_budget).
"""

from __future__ import annotations

from typing import Any

from .. import chains
from ..events import make
from ..image import Image
from wire.errors import invalid, rejection
from . import Decider, decide_each
from .lookups import registered_broker
from .lookups import existing_topic


def seal_one(image: Image, broker: str, c: dict[str, Any]):
    t = existing_topic(image, {"topic": c["topic"]})
    seg = image.segment(c["topic"], c["queue"], c["gen"])
    # physical_queue names the topic's incarnation too: a late report about a deleted topic's segment must not
    # seal the same (topic, queue, gen) of a topic created again under that name.
    # Only the sealer reports: the leader, or after a failover the elected replica, whose copy's end is the end.
    if seg is None or seg["sealer"] != broker or c.get("physical_queue", seg["physical_queue"]) != seg["physical_queue"]:
        raise rejection(404, "SEGMENT_NOT_FOUND", "no such segment on this broker",
                        topic=c["topic"], queue=c["queue"], gen=c["gen"])
    if seg["state"] == "sealed":
        if seg["physical_end"] == c["end_offset"]:
            return [], {"logic_end": seg["logic_end"]}
        raise rejection(409, "ALREADY_SEALED", "the segment was already sealed at another offset",
                        physical_end=seg["physical_end"], by=seg["sealed_by"])
    if seg["state"] != "sealing":
        raise rejection(409, "NOT_SEALING", "the segment is not being sealed", state=seg["state"])
    if not seg["physical_start"] <= c["end_offset"] <= seg["budget_end"]:
        raise invalid("end_offset is outside the segment's granted budget",
                      physical_start=seg["physical_start"], budget_end=seg["budget_end"])
    logic_end = chains.logic_end(seg, c["end_offset"])
    events = [make("SegmentSealed", topic=c["topic"], queue=c["queue"], gen=c["gen"], broker=seg["broker"],
                   physical_end=c["end_offset"], logic_end=logic_end, by="broker")]
    nxt = chains.head_of(t, c["queue"])
    # Harmless mutant: ``or`` for ``and`` below. A segment being sealed is always the one right before its head, whose
    # logic start waits on this seal (a head moves on only once its logic start is decided: writable_head, and
    # _head_lost's failover): both hold, or neither.
    if nxt["gen"] == c["gen"] + 1 and nxt["logic_start"] is None:
        events.append(make("LogicStartDecided", topic=c["topic"], queue=c["queue"], gen=nxt["gen"],
                           logic_start=logic_end))
    return events, {"logic_end": logic_end}


# -- the commands ------------------------------------------------------------------------------------------------
def seal(image: Image, c, ts, budget):
    registered_broker(image, c["broker"], c["epoch"])
    return seal_one(image, c["broker"], c)


def seal_many(image: Image, c, ts, budget):
    """Many seal reports of one broker in one command (a remap of thousands of queues seals thousands of
    segments: one command each made a route version, and a route rendering, each). Each report is decided on
    its own: a refused one is an item of the result and changes nothing; the others apply."""
    registered_broker(image, c["broker"], c["epoch"])
    return decide_each(c["seals"], lambda report: seal_one(image, c["broker"], report))


DECIDERS: dict[str, Decider] = {
    "SealSegment": seal,
    "SealSegments": seal_many,
}
