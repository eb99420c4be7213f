"""Decisions about topics: create, grow, configure, delete, remap; and the seal-then-switch of one queue that a remap
and a growth make (``move``, DESIGN.md "The flow of one remap"; the seal a broker reports back is segments.py).

Where queues go and how slots split is meta/allocation.py; what a topic change does to the groups naming it is
groups.topic_changed.
"""

from __future__ import annotations

from typing import Any

from .. import allocation, chains, limits
from ..events import make
from ..image import Image
from wire.errors import invalid, rejection
from . import Decider, Events, expect_version
from .lookups import active_brokers, existing_topic, registered_broker, seal_at_budget
from .groups import topic_changed
from .replicas import heads_holding, in_sync_of, placeable, replica_set, scoped, sealed_holding, settings


def writable_head(t: dict[str, Any], queue: int) -> dict[str, Any]:
    head = chains.head_of(t, queue)
    if head["state"] != "active" or head["logic_start"] is None:
        raise rejection(503, "SEALING", f"queue {queue} of {t['topic']!r} is still being remapped; retry shortly",
                        topic=t["topic"], queue=queue, gen=head["gen"])
    return head


def move(image: Image, t: dict[str, Any], queue: int, to: str, cause: str, budget: int,
         preferred: list[str]) -> Events:
    """Seal-then-switch of one queue (DESIGN.md, the flow of one remap). Returns the events. The new generation is
    led by ``to`` and copied to the topic's count of replicas, taken from ``preferred`` brokers first."""
    old = chains.head_of(t, queue)
    gen = old["gen"] + 1
    topic = t["topic"]
    replicas = replica_set(image, t, to, preferred)
    opened = make("SegmentOpened", topic=topic, queue=queue, gen=gen, broker=to, from_broker=old["broker"],
                  physical_queue=allocation.physical_queue_name(topic, t["incarnation"], queue, gen),
                  physical_start=0, budget_end=budget, replicas=replicas, in_sync=in_sync_of(image, replicas),
                  cause=cause)
    if image.brokers[old["broker"]]["state"] == "active":
        return [make("SegmentSealing", topic=topic, queue=queue, gen=old["gen"], broker=old["broker"]), opened]
    # The old broker's session has expired: it can write nothing beyond its budget, so the budget end is a safe end.
    return [*seal_at_budget(topic, queue, old), opened,
            make("LogicStartDecided", topic=topic, queue=queue, gen=gen,
                 logic_start=chains.logic_end(old, old["budget_end"]))]


def placed(image: Image, t: dict[str, Any], leaders: dict[int, str], budget: int) -> list[dict[str, Any]]:
    """Gen 0 of each of ``leaders``' queues, each with the topic's count of replicas (``replica_set``). With no
    preferred brokers a queue's copies depend on its leader alone: worked out once per leader, not per queue (per
    queue, they were three quarters of a 1,000-queue creation's apply, on every node, under the image lock)."""
    by_leader: dict[str, tuple[list[str], list[str]]] = {}
    out = []
    for q, b in sorted(leaders.items()):
        if b not in by_leader:
            replicas = replica_set(image, t, b, [])
            by_leader[b] = (replicas, in_sync_of(image, replicas))
        replicas, in_sync = by_leader[b]
        out.append({"queue": q, "broker": b, "budget_end": budget, "replicas": list(replicas),
                    "in_sync": list(in_sync),
                    "physical_queue": allocation.physical_queue_name(t["topic"], t["incarnation"], q, 0)})
    return out


# -- the commands ------------------------------------------------------------------------------------------------
def create(image: Image, c, ts, budget):
    name = c["topic"]
    if name in image.topics:
        raise rejection(409, "TOPIC_EXISTS", f"topic {name!r} already exists", topic=name,
                        current_version=image.topics[name]["version"])
    expect_version(c, 0)
    if len(image.topics) >= limits.TOPICS_MAX:
        raise rejection(409, "TOO_MANY_TOPICS", f"at most {limits.TOPICS_MAX} topics")
    scope = c.get("scope") or limits.SCOPE_GLOBAL
    if c.get("brokers"):
        brokers = active_brokers(image, scoped(image, scope, c["brokers"]))
    else:
        brokers = placeable(image, scope)
        if not brokers:
            raise rejection(409, "NO_BROKERS", "no active broker to place the topic on" +
                            ("" if scope == limits.SCOPE_GLOBAL else f" in its scope {scope}"), scope=scope)
    # ``brokers`` says where the queues are led; their copies may go to any active broker of the scope, spread over
    # zones
    # Harmless mutant: None for the image here (settings reads only the command and the count of brokers).
    replicas, min_insync = settings(image, c, len(placeable(image, scope)))
    slots = c.get("slots", limits.SLOTS_DEFAULT)
    incarnation = image.version + 1
    leaders = allocation.balanced_assignment(range(c["queues"]), brokers, image.data["load"])
    segments = placed(image, {"topic": name, "incarnation": incarnation, "replicas": replicas, "scope": scope},
                      leaders, budget)
    config = {k: v for k, v in sorted(c.get("config", {}).items()) if v is not None}
    ev = make("TopicCreated", topic=name, incarnation=incarnation, queues=c["queues"], slots=slots,
              order=c.get("order", "best_tried"), config=config, replicas=replicas, min_insync=min_insync,
              scope=scope, slot_table=allocation.initial_slot_table(slots, c["queues"]), segments=segments)
    return [ev, *topic_changed(image, name, c["queues"])], {"topic": name, "queues": c["queues"],
                                                             "replicas": replicas, "min_insync": min_insync,
                                                             "scope": scope}


def grow(image: Image, c, ts, budget):
    t = existing_topic(image, c)
    new_count = c["queues"]
    if new_count < t["queues"]:
        raise invalid(f"a static topic only grows: it has {t['queues']} queues", queues=t["queues"])
    if new_count > t["slots"]:
        raise invalid(f"queues cannot exceed slots ({t['slots']})", slots=t["slots"])
    if new_count == t["queues"]:
        return [], {"topic": t["topic"], "queues": new_count}
    table, splits = allocation.grow_slot_table(allocation.slot_table(t["slot_table"]), range(t["queues"], new_count))
    split_queues = sorted({old for _, old in splits})
    heads = {q: writable_head(t, q) for q in split_queues}
    hosts = sorted({b for b in {chains.head(e)[chains.BROKER] for e in t["chains"]}
                    if image.brokers[b]["state"] == "active" and not image.brokers[b]["draining"]})
    if not hosts:
        hosts = placeable(image, t["scope"])
    if not hosts:
        raise rejection(409, "NO_BROKERS", "no active broker to place the new queues on", scope=t["scope"])
    placement = allocation.balanced_assignment(range(t["queues"], new_count), hosts, image.data["load"])
    segments = placed(image, t, placement, budget)
    barriers = [{"queue": nq, "after_queue": old, "after_gen": heads[old]["gen"] + 1} for nq, old in splits]
    events = [make("TopicGrown", topic=t["topic"], queues=new_count, slot_table=table, barriers=barriers,
                   segments=segments)]
    # The split point must be exact, so each split queue is sealed and continues in a new generation on the
    # same broker: the barrier offset is that generation's logic start.
    for q in split_queues:   # in place: the same leader, the same copies as far as their brokers are active
        events += move(image, t, q, heads[q]["broker"], "grow", budget, heads[q]["replicas"])
    events += topic_changed(image, t["topic"], new_count)
    return events, {"topic": t["topic"], "queues": new_count}


def set_config(image: Image, c, ts, budget):
    t = existing_topic(image, c)
    config = dict(t["config"])
    for k, v in c["config"].items():
        if v is None:
            config.pop(k, None)
        else:
            config[k] = v
    if len(config) > limits.CONFIG_KEYS_MAX:
        raise invalid(f"a topic has at most {limits.CONFIG_KEYS_MAX} config keys")
    if config == t["config"]:
        return [], {"topic": t["topic"], "config": config}
    config = dict(sorted(config.items()))
    ev = make("TopicConfigChanged", topic=t["topic"], config=config, changed=sorted(c["config"]))
    return [ev], {"topic": t["topic"], "config": config}


def delete(image: Image, c, ts, budget):
    t = existing_topic(image, c)
    return ([make("TopicDeleted", topic=t["topic"]), *topic_changed(image, t["topic"], None)],
            {"topic": t["topic"]})


def remap(image: Image, c, ts, budget):
    t = existing_topic(image, c)
    targets = active_brokers(image, scoped(image, t["scope"], c["brokers"]))
    queues = c.get("queues") or list(range(t["queues"]))
    for q in queues:
        if q >= t["queues"]:
            raise invalid(f"queue {q} does not exist; the topic has {t['queues']} queues", queue=q)
    heads = {q: writable_head(t, q) for q in queues}
    moves = allocation.rebalance({q: h["broker"] for q, h in heads.items()}, targets)
    events, moved = [], []
    for q, to in sorted(moves.items()):
        events += move(image, t, q, to, "remap", budget, targets)
        moved.append({"queue": q, "from": heads[q]["broker"], "to": to, "gen": heads[q]["gen"] + 1})
    return events, {"topic": t["topic"], "moved": moved}


def drain_step(image: Image, c, ts, budget):
    """One step of a drain: up to ``queues_max`` heads that hold a copy on the draining broker move (seal-then-switch,
    cause "drain") to a new gen whose copies are elsewhere: the same leader when it is not the broker, else the first
    of the drain's ``to``, then of the head's in-sync copies, that may take copies. The new gen starts empty, so its
    copies are in sync at once. Then each sealed segment it holds a copy of gets a copy on another broker (the
    drain's ``to`` first) that catches it up and reports it whole (``copies_held``), one copy at a time per segment.
    A head being sealed, or whose leader is fenced (a failover moves it), waits for a later step. No-op once the
    drain is stopped."""
    name = c["broker"]
    b = registered_broker(image, name)
    holding = heads_holding(image, name)
    if not b["draining"]:
        return [], {"broker": name, "moved": [], "copying": [], "remaining": len(holding),
                    "sealed_remaining": len(sealed_holding(image, name))}
    events: Events = []
    moved = []
    for topic, q in holding:
        if len(moved) >= c["queues_max"]:
            break
        t = image.topics[topic]
        head = chains.head_of(t, q)
        if head["state"] != "active" or head["logic_start"] is None \
                or image.brokers[head["broker"]]["state"] != "active":
            continue
        ok = set(placeable(image, t["scope"])) - {name}
        leader = head["broker"]
        if leader not in ok:
            leader = next((x for x in [*(b["drain_to"] or ()), *head["in_sync"], *sorted(ok)] if x in ok), None)
            if leader is None:
                continue
        preferred = [x for x in [*(b["drain_to"] or ()), *head["replicas"]] if x in ok]
        events += move(image, t, q, leader, "drain", budget, preferred)
        moved.append({"topic": topic, "queue": q, "from": head["broker"], "to": leader, "gen": head["gen"] + 1})
    sealed = sealed_holding(image, name)
    copying = []
    for topic, q, seg in sealed:
        if len(moved) + len(copying) >= c["queues_max"]:
            break
        if set(seg[chains.REPLICAS]) - set(seg[chains.IN_SYNC]):
            continue   # a copy of it is being caught up already
        t = image.topics[topic]
        allowed = placeable(image, t["scope"])
        ok = [x for x in [*(b["drain_to"] or ()), *allowed]
              if x in allowed and x != name and x not in seg[chains.REPLICAS]]
        if not ok:
            continue
        events.append(make("SegmentCopiesChanged", topic=topic, queue=q, gen=seg[chains.GEN],
                           replicas=[*seg[chains.REPLICAS], ok[0]], in_sync=list(seg[chains.IN_SYNC]),
                           reason="moving"))
        copying.append({"topic": topic, "queue": q, "gen": seg[chains.GEN], "to": ok[0]})
    return events, {"broker": name, "moved": moved, "copying": copying, "remaining": len(holding) - len(moved),
                    "sealed_remaining": len(sealed)}


def copies_held(image: Image, c, ts, budget):
    """A broker holds whole copies of sealed segments a drain placed on it: it joins their in-sync set, and a draining
    broker's copy of each is no longer named (its data stays on its disk; nothing reads it there again)."""
    broker = c["broker"]
    registered_broker(image, broker, c["epoch"])
    events: Events = []
    results = []
    for h in c["copies"]:
        t = image.topics.get(h["topic"])
        seg = None
        if t is not None and h["queue"] < t["queues"]:
            seg = next((s for s in chains.segments(t["chains"][h["queue"]]) if s[chains.GEN] == h["gen"]), None)
        if seg is None or seg[chains.STATE] != "sealed" or broker not in seg[chains.REPLICAS]:
            results.append({**h, "outcome": "not_named"})
            continue
        end = seg[chains.PHYSICAL_START] + seg[chains.LOGIC_END] - seg[chains.LOGIC_START]
        if h["end"] < end:
            results.append({**h, "outcome": "short"})
            continue
        in_sync = [*seg[chains.IN_SYNC], broker] if broker not in seg[chains.IN_SYNC] else list(seg[chains.IN_SYNC])
        dropped = [x for x in seg[chains.REPLICAS] if x != broker and image.brokers[x]["draining"]]
        replicas = [x for x in seg[chains.REPLICAS] if x not in dropped]
        in_sync = [x for x in in_sync if x not in dropped]
        if (replicas, in_sync) != (list(seg[chains.REPLICAS]), list(seg[chains.IN_SYNC])):
            events.append(make("SegmentCopiesChanged", topic=h["topic"], queue=h["queue"], gen=h["gen"],
                               replicas=replicas, in_sync=in_sync, reason="moved"))
        results.append({**h, "outcome": "held"})
    return events, {"broker": broker, "copies": results}


DECIDERS: dict[str, Decider] = {
    "CreateTopic": create,
    "GrowTopic": grow,
    "SetTopicConfig": set_config,
    "DeleteTopic": delete,
    "RemapTopic": remap,
    "DrainStep": drain_step,
    "SealedCopiesHeld": copies_held,
}
