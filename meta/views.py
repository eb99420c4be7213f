"""Read models rendered from the image for the API: a topic's route and its admin description (API.md shapes)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from wire import group_event as group_event_shape
from wire import route as route_model

from . import allocation, chains, groups, limits
from .deciders.replicas import heads_holding, sealed_holding
from .image import Image


def broker_states(image: Image) -> dict[str, tuple[str, bool]]:
    """Each broker's (address, active), looked up once per rendering rather than once per segment."""
    return {name: (b["address"], b["state"] == "active") for name, b in image.brokers.items()}


def segment_ref(brokers: dict[str, tuple[str, bool]], t: dict[str, Any], queue: int,
                s: chains.Segment) -> route_model.SegmentJson:
    """A segment (the image's compact tuple) as routes and segment chains carry it: where it lives and which logic
    range it holds."""
    return route_model.segment_json(
        gen=s[chains.GEN], broker=s[chains.BROKER], address=brokers.get(s[chains.BROKER], (None,))[0],
        physical_queue=chains.physical_queue(t, queue, s), physical_start=s[chains.PHYSICAL_START],
        logic_start=s[chains.LOGIC_START], logic_end=s[chains.LOGIC_END], state=s[chains.STATE],
        budget_end=s[chains.BUDGET_END], replicas=list(s[chains.REPLICAS]), in_sync=list(s[chains.IN_SYNC]),
        sealer=chains.sealer(s))


def route(image: Image, t: dict[str, Any]) -> route_model.RouteJson:
    """What producers and consumers need: slot table, barriers, and per queue its writable head and its newest
    segments (at most ROUTE_SEGMENTS_PER_QUEUE_MAX: a route's size must not grow with the history). Read from the
    compact chains directly (meta/chains.py): a route of a thousand queues is rendered often."""
    brokers = broker_states(image)
    queues = []
    named: set[str] = set()
    for q, entry in enumerate(t["chains"]):
        segs = chains.segments(entry)
        head = segs[-1]
        active = brokers.get(head[chains.BROKER], (None, False))[1]
        writable = (head[chains.STATE] == "active" and head[chains.LOGIC_START] is not None and active
                    and len(head[chains.IN_SYNC]) >= t["min_insync"])
        kept = segs[-limits.ROUTE_SEGMENTS_PER_QUEUE_MAX:]
        # Every segment's, not only the carried ones': a head walks the older segments (committed offsets, pop
        # state, reads) and asks their holders at these addresses. Only the kept ones', a queue moved three times
        # left its first broker without an address, and a read of its committed offset waited for that "down"
        # holder for ever (the simulator, seed 1 under hash seed 5). At most every broker: bounded as it was.
        for s in segs:
            named.update(s[chains.REPLICAS])
        queues.append(route_model.queue_json(q, writable, [segment_ref(brokers, t, q, s) for s in kept]))
    # Copies of the topic's config and slot table: the view holds nothing the apply thread may change, so it can be
    # encoded after the image lock is released (meta/reads.py).
    return route_model.route_json(
        topic=t["topic"], version=t["version"], slots=t["slots"], order=t["order"], config=dict(t["config"]),
        replicas=t["replicas"], min_insync=t["min_insync"], scope=t["scope"],
        addresses={b: brokers[b][0] for b in sorted(named) if b in brokers},
        slot_table=allocation.slot_table(t["slot_table"]), slot_table_version=t.get("slot_table_version", 0), queues=queues,
        barriers=[{"queue": b["queue"], "after_queue": b["after_queue"], "after_offset": b["after_offset"]}
                  for b in t["barriers"]])


def topic_detail(t: dict[str, Any]) -> dict[str, Any]:
    ranges: dict[int, list[list[int]]] = {}
    for lo, hi, q in allocation.slot_table(t["slot_table"]):
        ranges.setdefault(q, []).append([lo, hi])
    return {"topic": t["topic"], "queues": t["queues"], "slots": t["slots"], "order": t["order"],
            "version": t["version"], "incarnation": t["incarnation"], "created_ms": t["created_ms"],
            "config": t["config"], "replicas": t["replicas"], "min_insync": t["min_insync"], "scope": t["scope"],
            "logic_queues": [{"queue": q, "slot_ranges": ranges.get(q, []),
                              "segments": [{k: s[k] for k in ("gen", "broker", "physical_queue", "physical_start",
                                                               "logic_start", "logic_end", "state", "budget_end",
                                                               "replicas", "in_sync", "sealer", "sealed_by")}
                                           for s in segs]}
                             for q, segs in chains.chains(t)]}


def topic_summary(t: dict[str, Any]) -> dict[str, Any]:
    return {"topic": t["topic"], "queues": t["queues"], "version": t["version"]}


def heads_held(image: Image) -> dict[str, int]:
    """How many logic queues each broker holds the head (writable or newest segment) of. One pass over every
    queue of every topic: asked for by operators (``GET /v1/brokers?include=heads``), not on any hot path."""
    held: dict[str, int] = {}
    for t in image.topics.values():
        for entry in t["chains"]:
            b = chains.head(entry)[chains.BROKER]
            held[b] = held.get(b, 0) + 1
    return held


def broker_holdings(image: Image, broker: str) -> dict[str, int]:
    """What a broker holds, for ``stator broker describe`` and a drain's progress: the heads it leads, the heads it
    holds a copy of (leader or not: what a drain still moves), and the older segments it holds a copy of (read
    there; a drain leaves them)."""
    heads = sum(1 for name in image.topics_on(broker) for entry in image.topics[name]["chains"]
                if chains.head(entry)[chains.BROKER] == broker)
    return {"heads": heads, "holding": len(heads_holding(image, broker)),
            "sealed_copies": len(sealed_holding(image, broker))}


def broker_view(b: dict[str, Any], last_heartbeat_ms: int | None) -> dict[str, Any]:
    """``last_heartbeat_ms``: when the leader last heard the broker (wall clock), None when not known."""
    return {"broker": b["broker"], "address": b["address"], "zone": b["zone"], "cluster": b["cluster"],
            "draining": b["draining"], "drain_to": b["drain_to"], "epoch": b["epoch"],
            "state": b["state"], "last_heartbeat_ms": last_heartbeat_ms}


def group_event(image: Image, g: dict[str, Any]) -> group_event_shape.GroupEvent:
    """What brokers enforce, sent on all-topic watch streams as a ``group`` event (one per group version); the shape
    and what each field means: wire/group_event.py."""
    # tokens_through: meta's whole counter of lock tokens when it rendered the group's state.
    return group_event_shape.GroupEvent(
        group=g["group"], version=g["version"], mode=g["mode"], tokens_through=image.data["lock_token"],
        locks=groups.lock_table(g, image.queue_count), config=groups.effective_config(g["group"], g))


def group_summary(g: dict[str, Any]) -> dict[str, Any]:
    return {"group": g["group"], "mode": g["mode"], "members": len(g["members"]),
            "locks": sum(len(qs) for qs in g["locks"].values()), "version": g["version"]}


def group_detail(g: dict[str, Any], lease_end: Callable[[str, int], int | None]) -> dict[str, Any]:
    """Members and assignments as the image has them; ``lease_end(member, lease_ms)`` is the leader's live view
    (None elsewhere). Committed offsets and lag are filled in by the caller, which asks the brokers."""
    config = groups.effective_config(g["group"], g)
    lease_ms = config["lease_ms"]
    members = [{"member": m, "topics": v["topics"], "mode": v["mode"], "joined_ms": v["joined_ms"],
                "lease_expires_ms": lease_end(m, lease_ms)} for m, v in sorted(g["members"].items())]
    assignments = [{"topic": topic, "queue": int(q), "member": lk["member"], "token": lk["token"],
                    "state": "owned" if groups.owned(lk) else "revoking", "target": lk["target"],
                    "granted_ms": lk["granted_ms"], "lease_expires_ms": lease_end(lk["member"], lease_ms)}
                   for topic in sorted(g["locks"]) for q, lk in sorted(g["locks"][topic].items(), key=lambda i: int(i[0]))]
    return {"group": g["group"], "mode": g["mode"], "config": config, "version": g["version"],
            "members": members, "assignments": assignments}
