"""The route: what a topic's producers, consumers and brokers need to know, defined once (API.md "Route").

Meta renders it (meta/views.py), brokers and clients check it before they hold it (``check``), and the test fakes
build it with the same functions, so the four can no longer drift. Routes stay plain JSON dicts on the hot paths
(rendered once per version, shared by every subscriber); the TypedDicts say what each dict holds.

Each queue carries its newest segments (at most meta's ROUTE_SEGMENTS_PER_QUEUE_MAX); a queue whose first carried
segment has gen > 0 has older ones, served by ``GET /v1/topics/{topic}/queues/{queue}/segments``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from typing_extensions import TypedDict  # pydantic (meta/api/models.py) reads these on Python < 3.12

SEGMENT_STATES = ("active", "sealing", "sealed")


class SegmentJson(TypedDict):
    gen: int
    broker: str
    address: str | None
    physical_queue: str
    physical_start: int
    logic_start: int | None    # None while undecided (the segment it continues is still sealing)
    logic_end: int | None      # None while the segment is open
    state: str
    budget_end: int            # physical offset (exclusive) the broker may write up to, as of this route
    replicas: list[str]        # brokers holding a copy, the leader (``broker``) first
    in_sync: list[str]         # those the leader waits for before it acknowledges a send
    sealer: str                # who reports the segment's end: the leader, or the replica elected after a failover


class QueueJson(TypedDict):
    queue: int
    broker: str                # the head segment's broker: where sends go (the leader)
    address: str | None
    physical_queue: str
    gen: int
    leader_epoch: int          # the head's gen: a new leader always starts a new generation
    replicas: list[str]        # the head's
    in_sync: list[str]         # the head's
    writable: bool
    segments: list[SegmentJson]


class BarrierJson(TypedDict):
    queue: int
    after_queue: int
    after_offset: int | None


class RouteJson(TypedDict):
    topic: str
    version: int
    slots: int
    order: str
    config: dict[str, str]
    slot_table: list[list[int]]   # [lo, hi, queue] ranges covering every slot once
    slot_table_version: int       # the version that last changed the slot table (creation or growth)
    replicas: int                 # copies of each head
    min_insync: int               # in-sync copies below which the leader refuses sends
    scope: list[str] | str        # the clusters its queues and copies stay in, or "global"
    addresses: dict[str, str]     # broker -> address, of every replica any segment of the topic names
    barriers: list[BarrierJson]
    queues: list[QueueJson]


def segment_json(*, gen: int, broker: str, address: str | None, physical_queue: str, physical_start: int,
                 logic_start: int | None, logic_end: int | None, state: str, budget_end: int,
                 replicas: list[str] | None = None, in_sync: list[str] | None = None,
                 sealer: str | None = None) -> SegmentJson:
    """``replicas`` and ``in_sync`` default to the leader alone, ``sealer`` to the leader (one copy)."""
    return {"gen": gen, "broker": broker, "address": address, "physical_queue": physical_queue,
            "physical_start": physical_start, "logic_start": logic_start, "logic_end": logic_end, "state": state,
            "budget_end": budget_end, "replicas": replicas or [broker], "in_sync": in_sync or [broker],
            "sealer": sealer or broker}


def queue_json(queue: int, writable: bool, segments: list[SegmentJson]) -> QueueJson:
    head = segments[-1]
    return {"queue": queue, "broker": head["broker"], "address": head["address"],
            "physical_queue": head["physical_queue"], "gen": head["gen"], "leader_epoch": head["gen"],
            "replicas": head["replicas"], "in_sync": head["in_sync"], "writable": writable, "segments": segments}


def route_json(*, topic: str, version: int, slots: int, order: str, config: dict[str, str],
               slot_table: list[list[int]], slot_table_version: int, barriers: list[BarrierJson],
               queues: list[QueueJson], replicas: int = 1, min_insync: int = 1, scope: list[str] | str = "global",
               addresses: dict[str, str] | None = None) -> RouteJson:
    if addresses is None:   # one copy each: the leaders' own
        addresses = {q["broker"]: q["address"] for q in queues if q["address"]}
    return {"topic": topic, "version": version, "slots": slots, "order": order, "config": config,
            "slot_table": slot_table, "slot_table_version": slot_table_version, "replicas": replicas,
            "min_insync": min_insync, "scope": scope, "addresses": addresses, "barriers": barriers,
            "queues": queues}


class RouteError(ValueError):
    """A route that does not have the shape above: it must not be held."""


def _int(v: Any, what: str, nullable: bool = False) -> None:
    if v is None and nullable:
        return
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise RouteError(f"{what} must be a non-negative integer")


def _str(v: Any, what: str, nullable: bool = False) -> None:
    if v is None and nullable:
        return
    if not isinstance(v, str) or not v:
        raise RouteError(f"{what} must be a non-empty string")


def check(route: Any) -> RouteJson:
    """The route itself if it has the shape above, else RouteError. Cheap enough for every route received."""
    if not isinstance(route, dict):
        raise RouteError("a route must be an object")
    _str(route.get("topic"), "topic")
    for k in ("version", "slots"):
        _int(route.get(k), k)
    _int(route.get("slot_table_version", 0), "slot_table_version")
    if not isinstance(route.get("slot_table"), list) or not isinstance(route.get("barriers"), list):
        raise RouteError("slot_table and barriers must be lists")
    queues = route.get("queues")
    if not isinstance(queues, list) or not queues:
        raise RouteError("queues must be a non-empty list")
    for i, q in enumerate(queues):
        if not isinstance(q, dict) or q.get("queue") != i:
            raise RouteError(f"queues[{i}] must be queue {i}")
        _str(q.get("broker"), "queue broker")
        _str(q.get("address"), "queue address", nullable=True)
        if not isinstance(q.get("writable"), bool):
            raise RouteError("writable must be a boolean")
        segs = q.get("segments")
        if not isinstance(segs, list) or not segs:
            raise RouteError(f"queue {i} must carry at least its head segment")
        for s in segs:
            if not isinstance(s, dict) or s.get("state") not in SEGMENT_STATES:
                raise RouteError(f"queue {i}: a segment needs a state in {SEGMENT_STATES}")
            _str(s.get("broker"), "segment broker")
            _str(s.get("physical_queue"), "physical_queue")
            _str(s.get("address"), "segment address", nullable=True)
            for k in ("gen", "physical_start", "budget_end"):
                _int(s.get(k), k)
            for k in ("logic_start", "logic_end"):
                _int(s.get(k), k, nullable=True)
            for k in ("replicas", "in_sync"):
                names = s.get(k)
                if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
                    raise RouteError(f"queue {i}: a segment's {k} must be a non-empty list of broker names")
            _str(s.get("sealer"), "sealer")
    addresses = route.get("addresses", {})
    if not isinstance(addresses, dict) or not all(isinstance(a, str) for a in addresses.values()):
        raise RouteError("addresses must map broker names to addresses")
    return route


@dataclass(frozen=True)
class Segment:
    """One segment of a logic queue, with the arithmetic between its logic and physical offsets."""
    topic: str
    queue: int
    gen: int
    broker: str
    address: str | None
    physical_queue: str
    physical_start: int
    logic_start: int | None
    logic_end: int | None
    state: str
    budget_end: int
    replicas: tuple[str, ...] = ()
    in_sync: tuple[str, ...] = ()
    sealer: str | None = None

    def physical(self, logic: int) -> int:
        return logic - self.logic_start + self.physical_start

    def logic(self, physical: int) -> int:
        return physical - self.physical_start + self.logic_start


def segment(topic: str, queue: int, s: SegmentJson) -> Segment:
    return Segment(topic, queue, s["gen"], s["broker"], s["address"], s["physical_queue"], s["physical_start"],
                   s["logic_start"], s["logic_end"], s["state"], s["budget_end"], tuple(s["replicas"]),
                   tuple(s["in_sync"]), s["sealer"])
