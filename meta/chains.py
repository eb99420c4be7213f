"""A topic's segment chains in the image, in compact form.

Ten million logic queues must fit in a few GiB per node, so the image cannot hold a dict per segment (about 650 B
each, a list per queue on top). Instead ``topic["chains"]`` holds, per logic queue, one entry:

- a lone segment, stored bare as a tuple of ``FIELDS`` (most queues never move), or
- a tuple of such segments, oldest first, once the queue has moved.

Segments are immutable: a change replaces the tuple, so equal segments may be shared. A topic's creation makes one
segment per broker and shares it between every queue placed there, which brings a fresh queue down to one pointer.
``physical_queue`` is kept as ``None`` when it is the name ``allocation.physical_queue_name`` derives from the
topic, its incarnation, the queue and the generation (every name the state machine makes is), and resolved on read.

Everything here stays plain data (tuples encode as JSON lists), so snapshots and ``Image.canonical_bytes`` need no
special case, and a snapshot's lists are turned back into shared tuples by ``restore``. Readers that want a segment
as the API shows it take ``as_dict`` / ``chain``; scans over many queues use the raw tuples and the field indexes.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

from .allocation import physical_queue_name

# ``broker`` is the segment's leader (where sends go); ``replicas`` every broker holding a copy, leader first;
# ``in_sync`` those the leader waits for before it acknowledges (DESIGN.md invariant 12); ``sealer`` the broker that
# must report a sealing segment's end: its leader, or after a failover the in-sync replica elected in its place.
# The leader epoch of a queue is its head's gen: a new leader always starts a new generation.
FIELDS = ("gen", "broker", "physical_queue", "physical_start", "logic_start", "logic_end", "physical_end",
          "budget_end", "state", "opened_ms", "sealed_ms", "sealed_by", "replicas", "in_sync", "sealer")
(GEN, BROKER, PHYSICAL_QUEUE, PHYSICAL_START, LOGIC_START, LOGIC_END, PHYSICAL_END, BUDGET_END, STATE, OPENED_MS,
 SEALED_MS, SEALED_BY, REPLICAS, IN_SYNC, SEALER) = range(len(FIELDS))
_INDEX = {name: i for i, name in enumerate(FIELDS)}

Segment = tuple


def names(values: Any) -> tuple[str, ...]:
    """A list of broker names as the image keeps it: a tuple of interned strings (equal sets share their strings)."""
    return tuple(sys.intern(v) for v in values)


def new_segment(topic: dict[str, Any], queue: int, gen: int, broker: str, physical_queue: str,
                physical_start: int, logic_start: int | None, budget_end: int, ts: int,
                replicas: tuple[str, ...], in_sync: tuple[str, ...]) -> Segment:
    if physical_queue == physical_queue_name(topic["topic"], topic["incarnation"], queue, gen):
        physical_queue = None
    return (gen, broker, physical_queue, physical_start, logic_start, None, None, budget_end, "active", ts, None, None,
            names(replicas), names(in_sync), None)


def replaced(seg: Segment, **changes: Any) -> Segment:
    out = list(seg)
    for name, value in changes.items():
        out[_INDEX[name]] = value
    return tuple(out)


# -- one entry of topic["chains"] ---------------------------------------------------------------------------------
def segments(entry: tuple) -> tuple[Segment, ...]:
    """The chain one entry holds, oldest first."""
    return entry if type(entry[0]) is tuple else (entry,)


def head(entry: tuple) -> Segment:
    return entry[-1] if type(entry[0]) is tuple else entry


def entry_of(chain: tuple[Segment, ...]) -> tuple:
    return chain[0] if len(chain) == 1 else chain


# -- reads as the API shows them -----------------------------------------------------------------------------------
def physical_queue(topic: dict[str, Any], queue: int, seg: Segment) -> str:
    pq = seg[PHYSICAL_QUEUE]
    return pq if pq is not None else physical_queue_name(topic["topic"], topic["incarnation"], queue, seg[GEN])


def as_dict(topic: dict[str, Any], queue: int, seg: Segment) -> dict[str, Any]:
    out = dict(zip(FIELDS, seg))
    out["physical_queue"] = physical_queue(topic, queue, seg)
    out["replicas"], out["in_sync"] = list(seg[REPLICAS]), list(seg[IN_SYNC])
    out["sealer"] = sealer(seg)
    return out


def sealer(seg: Segment) -> str:
    """Who must report the segment's end: the broker elected for it, else its leader."""
    return seg[SEALER] if seg[SEALER] is not None else seg[BROKER]


def chain(topic: dict[str, Any], queue: int) -> list[dict[str, Any]]:
    """Queue ``queue``'s segments as dicts, oldest first (copies: changing them changes nothing)."""
    return [as_dict(topic, queue, s) for s in segments(topic["chains"][queue])]


def head_of(topic: dict[str, Any], queue: int) -> dict[str, Any]:
    return as_dict(topic, queue, head(topic["chains"][queue]))


def chains(topic: dict[str, Any]) -> Iterator[tuple[int, list[dict[str, Any]]]]:
    for q in range(len(topic["chains"])):
        yield q, chain(topic, q)


def logic_end(seg: dict[str, Any], physical_end: int) -> int:
    """The logic offset (exclusive) segment ``seg`` (a dict: ``as_dict``) ends at when it ends at ``physical_end``."""
    return seg["logic_start"] + (physical_end - seg["physical_start"])


# -- from a snapshot ----------------------------------------------------------------------------------------------
def restore(topic: dict[str, Any]) -> None:
    """Turn a topic's chains read from a snapshot into the compact form in place: JSON lists back into tuples,
    equal segments shared again, broker names interned. A snapshot written before this form (``logic_queues``, a
    list of segment dicts per queue) is converted."""
    shared: dict[Segment, Segment] = {}

    def one(seg: Any, queue: int) -> Segment:
        if isinstance(seg, dict):
            values = [seg.get(name) for name in FIELDS]
            if values[PHYSICAL_QUEUE] == physical_queue_name(topic["topic"], topic["incarnation"], queue,
                                                             values[GEN]):
                values[PHYSICAL_QUEUE] = None
            if values[SEALER] == values[BROKER]:   # as_dict resolves it; the image keeps None for "its leader"
                values[SEALER] = None
        else:
            values = list(seg)
        if len(values) != len(FIELDS):
            raise ValueError(f"a segment has {len(values)} fields, not {len(FIELDS)}: a snapshot of another version")
        values[BROKER] = sys.intern(values[BROKER])
        values[REPLICAS], values[IN_SYNC] = names(values[REPLICAS]), names(values[IN_SYNC])
        t = tuple(values)
        return shared.setdefault(t, t)

    if "logic_queues" in topic:
        old = topic.pop("logic_queues")
        topic["chains"] = [entry_of(tuple(one(s, q) for s in segs)) for q, segs in enumerate(old)]
        return
    restored = []
    for q, e in enumerate(topic["chains"]):
        if isinstance(e[0], (list, tuple)):
            restored.append(tuple(one(s, q) for s in e))
        else:
            restored.append(one(e, q))
    topic["chains"] = restored
